"""`stepscope ddp`: the data-parallel benchmark, parent side. Runs `bench_rank.bench_rank` on every rank
through the launcher, combines the ranks and derives what the command prints and records.

Derived figures (formulas visible on purpose):
- a step's time is the SLOWEST rank's time in that round (ranks start each step together);
- exposed communication = median over rounds of (step - compute-only step of the same round), and its
  fraction of the median step;
- overlap = hidden / median(communication alone), hidden = median(communication alone) - exposed kept within
  [0, communication alone]: 1 means every byte hid behind backward, 0 means none did (a variant that costs more
  than its communication, through copies, hooks or contention, hid none: the excess shows in the exposed time);
- variants are compared by the ratio of their median step times (timed in the same interleaved rounds), the
  medians printed beside it;
- alpha-beta fit of all-reduce time t(n) = alpha + n / w over several sizes n (`collectives.alpha_beta`), and the
  bucket size that minimises the exposed overhead s/(n_b·w) + n_b·alpha of n_b buckets for s
  bytes of gradients: n_b* = sqrt(s / (w·alpha)), b* = s / n_b* = sqrt(s·w·alpha).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stepscope.distributed.data_parallel.bench_config import DDPBenchConfig
from stepscope.distributed.data_parallel.bench_result import DDPBenchResult, VariantResult
from stepscope.measure.stats import Stats
from stepscope.results.files import check_plot_file
from stepscope.results.store import RecordStore, make_record, point_key


# ---- running -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DDPOutOfMemory:
    """A point whose model, data or first step did not fit on some rank."""

    config: DDPBenchConfig
    note: str
    device: str
    world_size: int

    def records(self, env: dict) -> list[dict]:
        """One `oom` record per variant of the point (and its compute-only baseline): the keys a resume skips."""
        return [make_record("ddp", self.config.record_config(variant, cap), {}, status="oom", note=self.note, env=env)
                for variant, cap in [("compute", None), *self.config.points()]]


def run_ddp_benchmark(config: DDPBenchConfig) -> DDPBenchResult | DDPOutOfMemory | None:
    """Launch the ranks and combine them; None on non-zero ranks under torchrun; `DDPOutOfMemory` when the
    point did not fit (the ranks agreed on it before any timing)."""
    from stepscope.distributed.collectives.alpha_beta import fit_alpha_beta
    from stepscope.distributed.data_parallel.bench_rank import COMPUTE, bench_rank, label_of
    from stepscope.distributed.launch.launcher import LaunchConfig, launch

    config.validate()
    per_rank = launch(bench_rank, config, config=LaunchConfig(world_size=config.world, backend=config.backend,
                                                               threads=config.threads, timeout_s=config.timeout_s,
                                                               oversubscribe=config.oversubscribe))
    if per_rank is None or per_rank[0] is None:
        return None
    first = per_rank[0]
    if "oom" in first:
        note = next((rank["oom"] for rank in per_rank if not rank["oom"].endswith("on another rank")), first["oom"])
        return DDPOutOfMemory(config, note, first["device"], first["world_size"])

    def slowest(key: str, label: str) -> list[float]:
        """Per round, the wall time of the slowest rank."""
        return [max(wall for wall, _ in runs) for runs in zip(*(rank[key][label] for rank in per_rank), strict=True)]

    def cores_busy(key: str, label: str) -> float:
        """CPU seconds / wall seconds of a rank over all its runs, averaged over ranks."""
        return float(np.mean([sum(cpu for _, cpu in rank[key][label]) / sum(wall for wall, _ in rank[key][label])
                              for rank in per_rank]))

    def combine(variant: str, cap: float | None) -> VariantResult:
        label = COMPUTE if variant == COMPUTE else label_of(variant, cap)
        rounds = slowest("steps", label)
        comm = Stats.of(slowest("comm", label)) if variant != COMPUTE else None
        error = max(rank["errors"].get(label, 0.0) for rank in per_rank)
        return VariantResult(label=label, variant=variant, bucket_MiB=cap, step=Stats.of(rounds), rounds=rounds,
                             comm_alone=comm, n_buckets=len(first["messages"].get(label, [])),
                             max_rel_error=error, ok=error <= first["check_rtol"],
                             comm_buffers_MiB=first["comm_buffers_MiB"].get(label, 0.0),
                             synced_grads_MiB=first["synced_grads_MiB"].get(label, 0.0),
                             step_cores=cores_busy("steps", label),
                             comm_cores=cores_busy("comm", label) if variant != COMPUTE else None)

    sizes = sorted(first["allreduce"])
    slowest_per_repeat = {n: [max(v) for v in zip(*(rank["allreduce"][n] for rank in per_rank), strict=True)]
                          for n in sizes}
    allreduce_points = [(n, float(np.median(slowest_per_repeat[n]))) for n in sizes]
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


@dataclass
class DDPSweepOutcome:
    """What a sweep of benchmark points did (on the reporting rank: every rank but 0 under torchrun/Slurm
    sees `reporting` False and nothing else)."""

    results: list[DDPBenchResult] = field(default_factory=list)
    skipped: int = 0
    """Points a resume found recorded already."""
    oom: int = 0
    """Points that did not fit (recorded as `oom` rows)."""
    plot: Path | None = None
    reporting: bool = True

    @property
    def wrong(self) -> list[str]:
        """Variants whose averaged gradients differed from the reference (their timings are no success)."""
        return [v.label for result in self.results for v in result.variants if not v.ok]


def run_ddp_sweep(configs: list[DDPBenchConfig], out: str | os.PathLike | None = None, *, resume: bool = False,
                  plot: str | os.PathLike | None = None,
                  on_result: Callable[[DDPBenchConfig, DDPBenchResult], None] = lambda config, result: None,
                  on_oom: Callable[[DDPOutOfMemory], None] = lambda oom: None) -> DDPSweepOutcome:
    """Benchmark every point, appending its `ddp` records to `<out>/ddp.jsonl` (None: not stored) as it
    finishes and redrawing the bucket-sweep plot (`plot`) after each. Every point, the backend and precision
    on this machine and every file are checked before any rank starts."""
    from stepscope.distributed.data_parallel.plot import plot_bucket_sweep
    from stepscope.distributed.launch.ranks import external_launch_env
    from stepscope.measure.environment import torch_environment

    for config in configs:
        config.validate()
    _check_environment(configs[0])
    store = RecordStore(out, "ddp").check_writable() if out is not None else None
    if plot is not None:
        check_plot_file(plot)
    external = external_launch_env()
    outcome = DDPSweepOutcome(reporting=external is None or external["rank"] == 0)
    done = store.done_keys() if (store is not None and resume) else set()
    for config in configs:
        keys = {point_key("ddp", config.record_config(v, cap)) for v, cap in [("compute", None), *config.points()]}
        if keys <= done:
            outcome.skipped += 1
            continue
        result = run_ddp_benchmark(config)
        if result is None or not outcome.reporting:
            continue
        if isinstance(result, DDPOutOfMemory):  # a row per variant, and the sweep goes on
            if store is not None:
                for record in result.records(torch_environment(result.device, result.world_size)):
                    store.append(record)
            outcome.oom += 1
            on_oom(result)
            continue
        if store is not None:
            for record in result.records(torch_environment(result.device, result.world_size)):
                store.append(record)
        outcome.results.append(result)
        on_result(config, result)
        if plot is not None:
            outcome.plot = plot_bucket_sweep(outcome.results, plot)
    return outcome


def _check_environment(config: DDPBenchConfig) -> None:
    """Backend and precision must work here before any rank is spawned."""
    import torch

    from stepscope.distributed.launch.rank import resolve_backend
    from stepscope.distributed.launch.ranks import external_launch_env
    from stepscope.measure.device import check_precision

    external = external_launch_env()
    backend = resolve_backend(config.backend, external["local_world_size"] if external else config.world)
    check_precision(torch.device("cuda" if backend == "nccl" else "cpu"), config.precision)
