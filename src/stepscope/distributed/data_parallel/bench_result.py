"""What the data-parallel benchmark found for one point, combined over ranks, and its views: the table rows,
the memory rows, the summary lines and the `ddp` records (see `benchmark` for how the figures are derived)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.distributed.data_parallel.bench_config import BASELINES, DDPBenchConfig, MiB
from stepscope.errors import UsageError
from stepscope.measure.stats import Stats
from stepscope.results.store import make_record
from stepscope.spec import ModelSpec


@dataclass
class VariantResult:
    """One variant at one cap, combined over ranks (times in seconds)."""

    label: str
    variant: str
    bucket_MiB: float | None
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
        return float(np.median([a - b for a, b in zip(result.rounds, self.compute.rounds, strict=True)]))

    def overlap(self, result: VariantResult) -> float | None:
        """Share of the variant's communication that ran under compute, in [0, 1]: hidden = comm alone − exposed,
        at least 0 (a step that grew by more than its communication hid none; the excess is overhead, and shows in
        the exposed time) and at most comm alone (a step that did not grow hid all of it)."""
        if result.comm_alone is None or result.comm_alone.median <= 0:
            return None
        alone = result.comm_alone.median
        return min(max(alone - self.exposed_s(result), 0.0), alone) / alone

    def bstar_bytes(self) -> float:
        """b* = sqrt(s·w·alpha), at most s (one bucket)."""
        if not (self.alpha_s > 0 and self.bandwidth_Bps > 0):
            return float("nan")
        return min(float(self.grad_bytes), math.sqrt(self.grad_bytes * self.bandwidth_Bps * self.alpha_s))

    def step_ratio(self, a: VariantResult, b: VariantResult) -> float:
        """Median step time of `a` / that of `b`: the ratio of the medians printed beside it (both timed in the
        same interleaved rounds)."""
        return a.step.median / b.step.median

    def best(self, variants: Sequence[str]) -> VariantResult | None:
        """The fastest of `variants`, judged by exposed communication: a paired, per-round difference, so a
        burst of load on the machine during one variant's steps does not crown it or sink it."""
        candidates = [v for v in self.variants if v.variant in variants]
        return min(candidates, key=self.exposed_s) if candidates else None

    def torch_twin(self, result: VariantResult) -> VariantResult | None:
        if result.variant != "bucketed":
            return None
        return next((v for v in self.variants if v.variant == "torch" and v.bucket_MiB == result.bucket_MiB), None)

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
                "vs_torch": self.step_ratio(result, twin) if twin else None,
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
                parts.append(f"{self.step_ratio(best, other):.3f}x {other.label}")
            lines.append(", ".join(parts) + f" (ratios of the median step times over {len(best.rounds)} "
                         f"interleaved rounds; best = least exposed communication)")
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
        records = []
        bstar = self.bstar_bytes()
        for result, row in zip([self.compute, *self.variants], self.rows(), strict=True):
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
            config = self.config.record_config(result.variant, result.bucket_MiB)
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
