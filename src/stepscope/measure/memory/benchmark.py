"""`stepscope memory`: how memory rises and falls through one training step, phase by phase.

One point: allocation tracking starts, the `TrainingStep` is built inside a `stepscope.init` range, then
`warmup` steps run (AdamW creates its state in the first one) and one measured step, every phase inside
its `stepscope.<phase>` range. For init, the warm-up steps as a whole, and each phase of the measured
step: the bytes live at its end and the peak during it.

What is measured, and how (the output says which):
- CPU: the allocation tracker (allocations.py): profiler memory events of PyTorch's CPU allocator, each
  free matched to its allocation; bytes allocated since tracking began (i.e. since before the model).
- CUDA: `torch.cuda.memory_allocated` at the end of each phase and `torch.cuda.max_memory_allocated`
  during it (peak statistics reset at each phase start), minus what was allocated before the model;
  the tracker still gives the timeline and the largest allocations, and `snapshot` writes a
  `torch.cuda.memory._dump_snapshot` pickle (open it at https://pytorch.org/memory_viz).
Beside the measurements: the analytic size of one residual-stream activation, batch x seq x d_model x
bytes per element of the precision.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stepscope.errors import UsageError
from stepscope.measure.allocations import AllocationTrace, track_allocations
from stepscope.measure.device import cpu_threads, resolve_device, synchronize
from stepscope.measure.memory.config import TABLE_KINDS, MemoryConfig
from stepscope.measure.ranges import INIT_RANGE, phase_region
from stepscope.measure.training import transformer_step
from stepscope.results.sweep import Sweep, SweepOutcome
from stepscope.results.tables import Table
from stepscope.spec import bytes_per_element

MiB = 2**20
@dataclass
class PhaseMemory:
    """Bytes at the end of a phase and the most bytes live during it."""

    phase: str
    """init, warm-up (all steps before the measured one), forward, backward or optimizer."""
    current_bytes: int
    peak_bytes: int


@dataclass
class MemoryResult:
    """Per-phase memory of the measured step, the allocation trace, and how it was measured."""

    config: MemoryConfig
    phases: list[PhaseMemory]
    trace: AllocationTrace
    device: str
    method: str
    """What the per-phase numbers are, in words."""
    step_start_s: float
    """When the measured step began on the trace's clock (the largest-allocations table covers it)."""
    plot_path: Path | None = None
    snapshot_path: Path | None = None

    @property
    def residual_bytes(self) -> int:
        """One residual-stream activation: batch x seq x d_model x bytes per element."""
        workload = self.config.step.workload
        return workload.batch * workload.seq * self.config.step.model.d_model * bytes_per_element(workload.precision)

    @property
    def peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.phases)

    def tables(self) -> list[Table]:
        rows, previous = [], 0
        for p in self.phases:
            rows.append({"phase": p.phase, "current_MiB": p.current_bytes / MiB, "peak_MiB": p.peak_bytes / MiB,
                         "change_MiB": (p.current_bytes - previous) / MiB,
                         "peak_over_residual": p.peak_bytes / self.residual_bytes})
            previous = p.current_bytes
        element = bytes_per_element(self.config.step.workload.precision)
        title = (f"memory per phase; one residual-stream activation (batch x seq x d_model x {element} B) "
                 f"= {self.residual_bytes / MiB:.4g} MiB")
        return [Table("memory-phase", title, ("phase",), rows), self._largest_table()]

    def _largest_table(self) -> Table:
        step_ranges = [r for r in self.trace.ranges if r[1] >= self.step_start_s]
        end = max((r[2] for r in step_ranges), default=self.trace.duration_s)
        live = [a for a in self.trace.allocations
                if a.start_s <= end and (a.end_s is None or a.end_s >= self.step_start_s)]
        live.sort(key=lambda a: -a.nbytes)
        rows = []
        for rank, a in enumerate(live[:self.config.top], start=1):
            rows.append({"rank": rank, "size_MiB": a.nbytes / MiB, "allocated_in": self._phase_at(a.start_s),
                         "op": a.op, "allocator_op": a.allocator_op,
                         "freed_in": self._phase_at(a.end_s) if a.end_s is not None else "(live)",
                         "lifetime_ms": 1e3 * (a.end_s - a.start_s) if a.end_s is not None else None})
        return Table("memory-alloc", f"largest {len(rows)} allocations live during the measured step, "
                     "with the op that made them", ("rank",), rows)

    def _phase_at(self, time_s: float) -> str:
        for name, start, end in reversed(self.trace.ranges):
            if start <= time_s <= end and name.startswith("stepscope."):
                phase = name.removeprefix("stepscope.")
                return phase if start >= self.step_start_s or phase == "init" else f"{phase} (warm-up)"
        return "between phases"

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for p in self.phases:
            metrics[f"{p.phase}_current_MiB"] = p.current_bytes / MiB
            metrics[f"{p.phase}_peak_MiB"] = p.peak_bytes / MiB
        metrics["peak_MiB"] = self.peak_bytes / MiB
        metrics["residual_MiB"] = self.residual_bytes / MiB
        metrics["param_MiB"] = self.config.step.model.param_bytes("fp32") / MiB
        metrics["allocations"] = len(self.trace.allocations)
        return metrics


def measure_memory(config: MemoryConfig, *, plot_path: str | Path | None = None,
                   snapshot_path: str | Path | None = None) -> MemoryResult:
    """Measure one point; write the timeline PNG and (CUDA) the allocator snapshot if paths are given."""
    step_config = config.step
    device = resolve_device(step_config.device)
    cuda = device.type == "cuda"
    if snapshot_path is not None and not cuda:
        raise UsageError("--snapshot needs a CUDA device (on CPU the timeline PNG shows the allocations)")
    gc.collect()  # blocks freed during tracking but allocated before it are ignored anyway; fewer is faster
    laps = _CudaLaps(device) if cuda else None
    with cpu_threads(step_config.threads), _cuda_history(snapshot_path), track_allocations(device) as trace:
        with torch.profiler.record_function(INIT_RANGE):
            step = transformer_step(step_config.model, step_config.workload, attention=step_config.attention,
                                device=device, compile=step_config.compile, seed=step_config.seed,
                                moe_impl=step_config.moe_impl)
        if laps:
            laps("init")
        region = phase_region()
        for _ in range(step_config.warmup):
            step.prepare()
            step.run(region=region)
        synchronize(device)
        if laps and step_config.warmup:
            laps("warm-up")
        step.prepare()
        step.run(lap=laps, region=region)
        synchronize(device)
    del step  # after tracking, so the model's own blocks show as live at the end of the timeline
    measured = [r for r in trace.ranges if r[0] == "stepscope.forward"]
    step_start_s = measured[-1][1] if measured else 0.0
    phases = laps.phases if laps else _phases_from_trace(trace, step_config.workload.phases, step_start_s,
                                                         warmup=step_config.warmup > 0)
    result = MemoryResult(config=config, phases=phases, trace=trace, device=device.type,
                          method=memory_method(device.type), step_start_s=step_start_s)
    if plot_path is not None:
        from stepscope.measure.memory.plot import plot_timeline

        result.plot_path = plot_timeline(trace, plot_path, title=_title(config, device.type),
                                         marker_s=result.step_start_s if step_config.warmup else None)
    result.snapshot_path = Path(snapshot_path) if snapshot_path is not None else None
    return result


def memory_method(device_type: str) -> str:
    """What the per-phase numbers are on this device, in words (printed and recorded)."""
    if device_type == "cuda":
        return "torch.cuda.memory_allocated at phase end, max_memory_allocated during the phase"
    return ("CPU allocator events from torch.profiler(profile_memory=True): bytes allocated since tracking "
            "began, frees matched by address")


def _phases_from_trace(trace: AllocationTrace, phases: tuple[str, ...], step_start_s: float,
                       warmup: bool) -> list[PhaseMemory]:
    """init, the warm-up steps (up to the measured step), then each phase of the measured (last) step,
    from the tracker's live-bytes timeline."""
    out = []
    init = [r for r in trace.ranges if r[0] == INIT_RANGE]
    init_end = init[-1][2] if init else 0.0
    if init:
        out.append(PhaseMemory("init", trace.live_at(init_end), trace.peak_between(0.0, init_end)))
    if warmup:
        out.append(PhaseMemory("warm-up", trace.live_at(step_start_s), trace.peak_between(init_end, step_start_s)))
    for phase in phases:
        occurrences = [r for r in trace.ranges if r[0] == f"stepscope.{phase}"]
        if occurrences:
            _, start, end = occurrences[-1]
            out.append(PhaseMemory(phase, trace.live_at(end), trace.peak_between(start, end)))
    return out


class _CudaLaps:
    """CUDA per-phase memory: a `lap(phase)` callback reading the allocator's statistics."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        self.base = torch.cuda.memory_allocated(device)
        self.phases: list[PhaseMemory] = []

    def __call__(self, phase: str) -> None:
        synchronize(self.device)
        self.phases.append(PhaseMemory(phase, torch.cuda.memory_allocated(self.device) - self.base,
                                       torch.cuda.max_memory_allocated(self.device) - self.base))
        torch.cuda.reset_peak_memory_stats(self.device)


@contextlib.contextmanager
def _cuda_history(snapshot_path: str | Path | None) -> Iterator[None]:
    """Record the CUDA allocator's history (with stacks) and dump it as a snapshot pickle at the end."""
    if snapshot_path is None:
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(snapshot_path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def _title(config: MemoryConfig, device: str) -> str:
    workload = config.step.workload
    return (f"{config.step.model.name} batch {workload.batch} seq {workload.seq} {workload.mode} "
            f"{workload.precision} {config.step.attention} ({device})")


def run_memory_sweep(configs: list[MemoryConfig], out: str | Path | None = None, *, resume: bool = False,
                     plot_dir: str | Path | None = None, snapshot: str | Path | None = None,
                     on_record: Callable[[dict[str, Any], MemoryConfig, MemoryResult | None], None]
                     = lambda record, config, result: None) -> SweepOutcome:
    """Measure every point. Table records (`memory-phase`, `memory-alloc`) first, then the summary record
    (`memory`, what --resume looks for); an OOM point becomes an `oom` row and the sweep goes on. A timeline
    PNG per point goes to `plot_dir` (None: none), a CUDA allocator snapshot per point to `snapshot`.
    Every point is validated and every file proven writable before any work."""
    from stepscope.measure.device import is_out_of_memory, release_memory
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.outputs import point_path, rank_path
    from stepscope.results.files import (
        check_results_folder,
        check_writable_dir,
        check_writable_file,
    )
    from stepscope.results.tables import append_tables, check_tables_writable

    for config in configs:
        config.validate()
    device = resolve_device(configs[0].step.device)
    if snapshot is not None:
        if device.type != "cuda":
            raise UsageError("--snapshot needs a CUDA device (on CPU the timeline PNG shows the allocations)")
        for index in range(len(configs)):
            check_writable_file(rank_path(point_path(snapshot, index, len(configs))), "the snapshot")
    if out is not None:
        check_results_folder(out)  # before the plots, which may go there: `--out FILE` says "not a folder"
    if plot_dir is not None:
        check_writable_dir(plot_dir, "timeline plots")
    if out is not None:
        check_tables_writable(out, ["memory", *TABLE_KINDS])
    index_of = {id(config): i for i, config in enumerate(configs)}
    names = [plot_name(config) for config in configs]

    def env(config: MemoryConfig) -> dict[str, Any]:
        return torch_environment(device, threads=config.step.threads)

    def config_of(config: MemoryConfig) -> dict[str, Any]:
        return {**config.record_config(), "method": memory_method(device.type)}

    def measure(config: MemoryConfig) -> tuple[dict[str, Any], MemoryResult]:
        index = index_of[id(config)]
        name = names[index] if names.count(names[index]) == 1 else f"{names[index]}-p{index}"
        plot = Path(plot_dir) / f"{name}.png" if plot_dir is not None else None
        snap = rank_path(point_path(snapshot, index, len(configs))) if snapshot is not None else None
        result = measure_memory(config, plot_path=plot, snapshot_path=snap)
        if out is not None:
            append_tables(out, result.tables(), "memory", config_of(config), env(config))
        return result.metrics(), result

    sweep = Sweep(kind="memory", points=configs, config_of=config_of, measure=measure, env_of=env,
                  is_oom=is_out_of_memory, after_oom=lambda: release_memory(device), table_kinds=TABLE_KINDS)
    return sweep.run(out, resume=resume, on_record=on_record)


def plot_name(config: MemoryConfig) -> str:
    """File name (no extension) of a point's timeline: `memory-small-b4-s128-train-fp32-sdpa`."""
    workload = config.step.workload
    name = (f"memory-{config.step.model.name}-b{workload.batch}-s{workload.seq}-{workload.mode}-"
            f"{workload.precision}-{config.step.attention}")
    threads = config.step.threads
    return name + (f"-t{threads}" if threads is not None else "")
