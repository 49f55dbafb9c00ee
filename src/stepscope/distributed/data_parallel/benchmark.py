"""`stepscope ddp`: the data-parallel benchmark, parent side. Runs `ddp_rank.bench_rank` on every rank
through the launcher, combines the ranks and derives what the command prints and records.

Derived figures (formulas visible on purpose):
- a step's time is the SLOWEST rank's time in that round (ranks start each step together);
- exposed communication = median over rounds of (step - compute-only step of the same round), and its
  fraction of the median step;
- overlap = 1 - exposed / median(communication alone): 1 means every byte hid behind backward, 0 means
  none did, below 0 means the variant costs more than its communication (copies, hooks, contention);
- variants are compared by the median of per-round ratios (the same round: same noise for both);
- alpha-beta fit of all-reduce time t(n) = alpha + n / w over several sizes n (`stepscope.distributed.collectives.alpha_beta`),
  and the bucket size that minimises the exposed overhead s/(n_b·w) + n_b·alpha of n_b buckets for s
  bytes of gradients: n_b* = sqrt(s / (w·alpha)), b* = s / n_b* = sqrt(s·w·alpha).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.measure.stats import Stats
from stepscope.spec import PRECISIONS, ModelSpec

ALL_VARIANTS = ("naive", "flat", "individual", "bucketed", "torch")
CAPPED = ("bucketed", "torch")
BASELINES = ("naive", "flat", "individual")
MiB = 2**20


@dataclass(frozen=True)
class DDPBenchConfig:
    """One point of the data-parallel benchmark: a model and batch, timed under every listed variant."""

    model: ModelSpec
    """The model to train (preset plus overrides)."""
    batch: int = 4
    """GLOBAL batch in sequences, split evenly across ranks."""
    seq: int = 128
    """Tokens per sequence."""
    world: int = 2
    """Ranks to spawn locally (under torchrun the launcher's world size is used)."""
    precision: str = "fp32"
    """fp32, or bf16/fp16 autocast (gradients stay fp32: the weights are fp32)."""
    variants: tuple[str, ...] = ALL_VARIANTS
    """naive, flat, individual, bucketed (ours), torch (torch.nn.parallel.DistributedDataParallel)."""
    bucket_mb: tuple[float | None, ...] = (1.0, 10.0, 100.0)
    """Bucket caps in MiB for bucketed and torch (None = one bucket)."""
    bucket_rule: str = "strict"
    """How DDPBucketed fills buckets: strict (never above the cap) or torch (close once reached)."""
    shard_optimizer: bool = False
    """Time the steps with ShardedOptimizer(AdamW) instead of AdamW (memory is reported for both)."""
    warmup: int = 1
    """Untimed interleaved rounds after the correctness check (which already ran each variant once)."""
    iters: int = 5
    """Timed rounds; each round runs every variant once, in a rotating order."""
    comm_iters: int = 5
    """Timed repetitions of communication alone and of each all-reduce size of the alpha-beta fit."""
    threads: int | None = None
    """Intra-op threads per rank (None: usable cores / ranks)."""
    backend: str = "auto"
    """auto, gloo or nccl."""
    seed: int = 0
    """Weights are seeded with seed + rank (rank 0's are broadcast); data likewise, so shards differ."""
    lr: float = 1e-4
    """AdamW learning rate."""
    timeout_s: float = 600.0
    """Collective timeout: a rank waiting this long on a peer fails instead of hanging."""

    def validate(self) -> None:
        """Everything checkable before spawning ranks (UsageError)."""
        if self.world < 1:
            raise UsageError(f"--world must be at least 1, got {self.world}")
        if self.batch % self.world:
            raise UsageError(f"global batch {self.batch} is not divisible by world size {self.world}")
        if self.seq > self.model.context_length:
            raise UsageError(f"seq={self.seq} exceeds the model's context_length={self.model.context_length}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {'|'.join(PRECISIONS)}, got {self.precision!r}")
        unknown = [v for v in self.variants if v not in ALL_VARIANTS]
        if unknown or not self.variants:
            raise UsageError(f"unknown variant {unknown[0] if unknown else ''!r}; choose from "
                             f"{','.join(ALL_VARIANTS)}")
        if any(cap is not None and not cap > 0 for cap in self.bucket_mb) or not self.bucket_mb:
            raise UsageError(f"bucket sizes must be positive MiB (or none), got {list(self.bucket_mb)}")
        if self.bucket_rule not in ("strict", "torch"):
            raise UsageError(f"bucket rule must be strict or torch, got {self.bucket_rule!r}")
        if self.warmup < 0 or self.iters < 1 or self.comm_iters < 1:
            raise UsageError("need warmup >= 0, iters >= 1 and comm-iters >= 1")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"threads must be positive, got {self.threads}")

    def points(self) -> list[tuple[str, float | None]]:
        """(variant, cap) in the order they are built and reported."""
        return [(v, cap) for v in self.variants for cap in (self.bucket_mb if v in CAPPED else (None,))]

    def record_config(self, variant: str, cap_mb: float | None) -> dict[str, Any]:
        config = {"model": self.model.name, "batch": self.batch, "seq": self.seq, "world": self.world,
                  "precision": self.precision, "variant": variant,
                  "bucket_mb": cap_mb if variant in CAPPED else None,
                  "bucket_rule": self.bucket_rule if variant == "bucketed" else None}
        config.update({k: v for k, v in dataclasses.asdict(self).items()
                       if k in ("shard_optimizer", "warmup", "iters", "comm_iters", "threads", "backend",
                                "seed", "lr")})
        config["model_spec"] = self.model.to_dict()
        return config


@dataclass
class VariantResult:
    """One variant at one cap, combined over ranks (times in seconds)."""

    label: str
    variant: str
    bucket_mb: float | None
    step: Stats
    """Per-round step time of the slowest rank."""
    rounds: list[float]
    comm_alone: Stats | None
    """The variant's all-reduces alone, slowest rank (None for compute)."""
    n_buckets: int
    max_rel_error: float
    """Averaged gradients vs the plain reference before timing (max |diff| / max |reference|)."""
    ok: bool
    comm_buffers_MiB: float
    """Buffers the variant keeps across steps for communication (rank 0)."""
    synced_grads_MiB: float
    """Gradient memory once synchronized: gradients plus communication buffers, each storage once."""
    step_cores: float
    """Cores a rank kept busy during the step: its CPU seconds (all threads) / wall seconds."""
    comm_cores: float | None
    """The same during communication alone (gloo reduces and copies on CPU threads of its own)."""


@dataclass
class DDPBenchResult:
    """A whole benchmark point: every variant, memory, the all-reduce fit and b*."""

    config: DDPBenchConfig
    compute: VariantResult
    variants: list[VariantResult]
    memory: dict[str, dict[str, dict[str, float]]]
    """{adamw|sharded: {init|before_step|after_step: {params, grads, optimizer, total}}} in MiB (rank 0)."""
    grad_bytes: int
    alpha_s: float
    bandwidth_Bps: float
    allreduce_points: list[tuple[int, float]]
    world_size: int
    threads: int
    backend: str
    device: str
    notes: list[str] = field(default_factory=list)

    # ---- derived ------------------------------------------------------------------------------------
    def exposed_s(self, result: VariantResult) -> float:
        """Median over rounds of step - compute-only step of the same round (pairs cancel slow drifts)."""
        return float(np.median([a - b for a, b in zip(result.rounds, self.compute.rounds)]))

    def overlap(self, result: VariantResult) -> float | None:
        if result.comm_alone is None or result.comm_alone.median <= 0:
            return None
        return 1.0 - self.exposed_s(result) / result.comm_alone.median

    def bstar_bytes(self) -> float:
        """b* = sqrt(s·w·alpha), at most s (one bucket)."""
        if not (self.alpha_s > 0 and self.bandwidth_Bps > 0):
            return float("nan")
        return min(float(self.grad_bytes), math.sqrt(self.grad_bytes * self.bandwidth_Bps * self.alpha_s))

    def paired_ratio(self, a: VariantResult, b: VariantResult) -> float:
        """Median over rounds of time(a) / time(b), both measured in the same round."""
        return float(np.median([x / y for x, y in zip(a.rounds, b.rounds)]))

    def best(self, variants: Sequence[str]) -> VariantResult | None:
        """The fastest of `variants`, judged by exposed communication: a paired, per-round difference, so a
        burst of load on the machine during one variant's steps does not crown it or sink it."""
        candidates = [v for v in self.variants if v.variant in variants]
        return min(candidates, key=self.exposed_s) if candidates else None

    def torch_twin(self, result: VariantResult) -> VariantResult | None:
        if result.variant != "bucketed":
            return None
        return next((v for v in self.variants if v.variant == "torch" and v.bucket_mb == result.bucket_mb), None)

    # ---- views ---------------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        rows = []
        tokens = self.config.batch * self.config.seq
        for result in [self.compute, *self.variants]:
            twin = self.torch_twin(result)
            overlap = self.overlap(result)
            exposed = self.exposed_s(result)
            rows.append({
                "variant": result.label, "buckets": result.n_buckets if result.variant != "compute" else None,
                "step_ms_median": result.step.median * 1e3, "step_ms_p10": result.step.p10 * 1e3,
                "step_ms_p90": result.step.p90 * 1e3, "tokens_per_s": tokens / result.step.median,
                "exposed_comm_ms": exposed * 1e3 if result.variant != "compute" else None,
                "exposed_pct": 100 * exposed / result.step.median if result.variant != "compute" else None,
                "comm_alone_ms": result.comm_alone.median * 1e3 if result.comm_alone else None,
                "overlap_pct": 100 * overlap if overlap is not None else None,
                "vs_torch": self.paired_ratio(result, twin) if twin else None,
                "grads_MiB": result.synced_grads_MiB if result.variant != "compute" else None,
                "check": "ok" if result.ok else f"MISMATCH {result.max_rel_error:.1e}",
            })
        return rows

    def memory_rows(self) -> list[dict[str, Any]]:
        return [{"optimizer": "AdamW" if name == "adamw" else "ShardedOptimizer(AdamW)", "point": point,
                 "params_MiB": split["params"], "grads_MiB": split["grads"], "optimizer_MiB": split["optimizer"],
                 "total_MiB": split["total"]}
                for name, points in self.memory.items() for point, split in points.items()]

    def summary_lines(self) -> list[str]:
        lines = []
        best = self.best(["bucketed"])
        if best is not None:
            parts = [f"best DDPBucketed: {best.label}"]
            others = [self.torch_twin(best), self.best(["torch"]), *(self.best([v]) for v in BASELINES)]
            unique = {o.label: o for o in others if o is not None}
            for other in unique.values():
                parts.append(f"{self.paired_ratio(best, other):.3f}x {other.label}")
            lines.append(", ".join(parts) + f" (step time ratios: medians of per-round ratios over "
                         f"{len(best.rounds)} rounds; best = least exposed communication)")
        s_mib = self.grad_bytes / MiB
        bstar = self.bstar_bytes()
        if math.isfinite(bstar):
            measured = (f"; measured best cap: {best.label.split(' ', 1)[1]}" if best is not None else "")
            lines.append(f"all-reduce fit t = alpha + n/w over {len(self.allreduce_points)} sizes: "
                         f"alpha = {self.alpha_s * 1e3:.3f} ms, w = {self.bandwidth_Bps / 1e9:.3f} GB/s; "
                         f"s = {s_mib:.1f} MiB of gradients -> b* = sqrt(s*w*alpha) = {bstar / MiB:.2f} MiB "
                         f"({self.grad_bytes / bstar:.1f} buckets){measured}")
        lines.extend(self.notes)
        return lines

    def records(self, env: dict[str, Any]) -> list[dict[str, Any]]:
        from stepscope.results.store import make_record

        records = []
        bstar = self.bstar_bytes()
        for result, row in zip([self.compute, *self.variants], self.rows()):
            metrics: dict[str, Any] = {**result.step.metrics("step"), "tokens_per_s": row["tokens_per_s"],
                                       "compute_step_ms_median": self.compute.step.median * 1e3,
                                       "step_cores_busy": result.step_cores}
            if result.variant != "compute":
                metrics.update({"exposed_comm_ms": row["exposed_comm_ms"],
                                "exposed_comm_fraction": row["exposed_pct"] / 100, "n_buckets": result.n_buckets,
                                "overlap_fraction": None if row["overlap_pct"] is None else row["overlap_pct"] / 100,
                                "max_rel_error": result.max_rel_error, "comm_buffers_MiB": result.comm_buffers_MiB,
                                "grads_MiB_synced": result.synced_grads_MiB})
                if result.comm_alone is not None:
                    metrics.update(result.comm_alone.metrics("comm_alone"))
                    metrics["comm_alone_cores_busy"] = result.comm_cores
                if row["vs_torch"] is not None:
                    metrics["step_ratio_vs_torch"] = row["vs_torch"]
            for name, points in self.memory.items():  # the bare model's first step (see memory_rows)
                suffix = "_sharded" if name == "sharded" else ""
                for point, split in points.items():
                    metrics[f"params_MiB_{point}{suffix}"] = split["params"]
                    metrics[f"grads_MiB_{point}{suffix}"] = split["grads"]
                    metrics[f"optimizer_MiB_{point}{suffix}"] = split["optimizer"]
            metrics.update({"grad_MiB": self.grad_bytes / MiB, "allreduce_alpha_ms": self.alpha_s * 1e3,
                            "allreduce_w_GBps": self.bandwidth_Bps / 1e9,
                            "bstar_MiB": bstar / MiB if math.isfinite(bstar) else None})
            metrics["threads"] = self.threads
            config = self.config.record_config(result.variant, result.bucket_mb)
            records.append(make_record("ddp", config, metrics, status="ok" if result.ok else "mismatch", env=env))
        return records


def model_label(spec: ModelSpec) -> str:
    """`small`, or `small (n_layers=4)` when fields were overridden."""
    from stepscope.spec import get_preset

    try:
        preset = get_preset(spec.name)
    except UsageError:
        return spec.name
    changed = [f"{f.name}={getattr(spec, f.name)}" for f in dataclasses.fields(spec)
               if f.name != "name" and getattr(spec, f.name) != getattr(preset, f.name)]
    return f"{spec.name} ({', '.join(changed)})" if changed else spec.name


# ---- running -------------------------------------------------------------------------------------------
def run_ddp_benchmark(config: DDPBenchConfig) -> DDPBenchResult | None:
    """Launch the ranks and combine them; None on non-zero ranks under torchrun."""
    from stepscope.distributed.collectives.alpha_beta import fit_alpha_beta
    from stepscope.distributed.data_parallel.bench_rank import COMPUTE, bench_rank, label_of
    from stepscope.distributed.launch.launcher import LaunchConfig, launch

    config.validate()
    per_rank = launch(bench_rank, config, config=LaunchConfig(world_size=config.world, backend=config.backend,
                                                               threads=config.threads, timeout_s=config.timeout_s))
    if per_rank is None or per_rank[0] is None:
        return None
    first = per_rank[0]

    def slowest(key: str, label: str) -> list[float]:
        """Per round, the wall time of the slowest rank."""
        return [max(wall for wall, _ in runs) for runs in zip(*(rank[key][label] for rank in per_rank))]

    def cores_busy(key: str, label: str) -> float:
        """CPU seconds / wall seconds of a rank over all its runs, averaged over ranks."""
        return float(np.mean([sum(cpu for _, cpu in rank[key][label]) / sum(wall for wall, _ in rank[key][label])
                              for rank in per_rank]))

    def combine(variant: str, cap: float | None) -> VariantResult:
        label = COMPUTE if variant == COMPUTE else label_of(variant, cap)
        rounds = slowest("steps", label)
        comm = Stats.of(slowest("comm", label)) if variant != COMPUTE else None
        error = max(rank["errors"].get(label, 0.0) for rank in per_rank)
        return VariantResult(label=label, variant=variant, bucket_mb=cap, step=Stats.of(rounds), rounds=rounds,
                             comm_alone=comm, n_buckets=len(first["messages"].get(label, [])),
                             max_rel_error=error, ok=error <= first["check_rtol"],
                             comm_buffers_MiB=first["comm_buffers_MiB"].get(label, 0.0),
                             synced_grads_MiB=first["synced_grads_MiB"].get(label, 0.0),
                             step_cores=cores_busy("steps", label),
                             comm_cores=cores_busy("comm", label) if variant != COMPUTE else None)

    sizes = sorted(first["allreduce"])
    allreduce_points = [(n, float(np.median([max(v) for v in zip(*(rank["allreduce"][n] for rank in per_rank))])))
                        for n in sizes]
    # the collectives benchmark's fit (relative least squares); bus factor 1: w is the algorithm bandwidth
    fit = fit_alpha_beta([n for n, _ in allreduce_points], [t * 1e6 for _, t in allreduce_points], bus_factor=1.0)
    alpha, bandwidth = fit.alpha_us * 1e-6, (fit.beta_GBps * 1e9 if fit.beta_GBps else float("nan"))
    compute = combine(COMPUTE, None)
    variants = [combine(v, cap) for v, cap in config.points()]
    notes = []
    if first["device"] == "cpu" and first["world_size"] > 1:
        comm_cores = float(np.median([v.comm_cores for v in variants if v.comm_cores is not None]))
        need = first["world_size"] * (compute.step_cores + comm_cores)
        notes.append(f"{first['world_size']} ranks x {first['threads']} intra-op thread(s) on {_cores()} core(s): "
                     f"a compute-only step keeps {compute.step_cores:.2f} core(s) per rank busy, communication "
                     f"alone {comm_cores:.2f} (CPU time / wall time); hiding all communication behind compute "
                     f"would need ~{need:.1f} cores")
        if compute.step_cores < 0.85 * min(first["threads"], _cores() / first["world_size"]):
            notes.append(f"warning: a compute-only step got {compute.step_cores:.2f} core(s) per rank of the "
                         f"{first['threads']} thread(s) it runs: other processes shared these cores, so times "
                         f"are contended (and 'overlap' can be CPU taken from them); rerun on a quiet machine")
    return DDPBenchResult(config=config, compute=compute, variants=variants, memory=first["memory"],
                          grad_bytes=first["grad_bytes"], alpha_s=alpha, bandwidth_Bps=bandwidth,
                          allreduce_points=allreduce_points, world_size=first["world_size"],
                          threads=first["threads"], backend=first["backend"], device=first["device"], notes=notes)


def _cores() -> int:
    from stepscope.host import usable_cores

    return usable_cores()
