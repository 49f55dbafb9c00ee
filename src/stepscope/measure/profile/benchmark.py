"""`stepscope profile`: run the same training step as `stepscope step` under torch.profiler and say where
the time goes.

One point: build the `TrainingStep`, run wait + warm-up + active steps under a profiler schedule (only the
active steps are recorded), with each phase inside a `stepscope.<phase>` range (record_function; plus NVTX
ranges with `nvtx=True` on CUDA, the active steps inside one `stepscope.active` NVTX range so Nsight
Systems can capture exactly them: `nsys profile --capture-range=nvtx --nvtx-capture=stepscope.active`).
Then time `iters` more steps with the timing harness and no profiler attached, for the timer-vs-profiler
table. Tables: see profile_tables.py and attention_pieces.py.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stepscope.measure.allocations import quiet_native_stderr
from stepscope.measure.device import cpu_threads, resolve_device, synchronize
from stepscope.measure.profile.attention_pieces import attention_pieces_table
from stepscope.measure.profile.config import TABLE_KINDS, ProfileConfig
from stepscope.measure.profile.events import (
    PHASE_GROUPS,
    PhaseRange,
    Work,
    attribute_work,
    phase_ranges,
)
from stepscope.measure.profile.tables import (
    category_table,
    group_seconds,
    groups_of,
    matmul_share_table,
    moe_table,
    timer_table,
    top_ops_table,
)
from stepscope.measure.ranges import ACTIVE_RANGE, nvtx_range, phase_region
from stepscope.measure.stats import Stats
from stepscope.measure.step.benchmark import time_phases
from stepscope.measure.training import transformer_step
from stepscope.results.sweep import Sweep, SweepOutcome
from stepscope.results.tables import Table


@dataclass
class ProfileResult:
    """Attributed work of the active steps, their phase ranges, and the timer's view of the same step."""

    config: ProfileConfig
    work: list[Work]
    ranges: list[PhaseRange]
    timer: dict[str, Stats]
    """Wall time per phase (and `step`) from the timing harness, profiler detached."""
    device: str
    threads: int
    events: list[Any] = field(default_factory=list, repr=False)
    """The profiler's FunctionEvents of the active steps (kept for the attention pieces)."""
    trace_path: Path | None = None
    _tables: list[Table] | None = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return "kernel time on the GPU" if self.device == "cuda" else "CPU self time of every op"

    def tables(self) -> list[Table]:
        """Every table of the point, in print order (computed once)."""
        if self._tables is None:
            self._tables = self._make_tables()
        return self._tables

    def _make_tables(self) -> list[Table]:
        steps = self.config.active
        groups = groups_of(self.config.step.workload.phases)
        tables: list[Table] = []
        for group in groups:
            tables.append(category_table(self.work, group, steps))
            tables.append(top_ops_table(self.work, group, steps, self.config.top))
        tables.append(matmul_share_table(self.work, groups, steps))
        tables.append(timer_table(self.work, self.ranges, self.timer, steps))
        if self.config.step.attention == "naive":
            tables.append(attention_pieces_table(self.events, self.ranges, steps, self.device))
        if self.config.step.model.is_moe:
            tables.append(moe_table(self.work, steps))
        return tables

    def metrics(self) -> dict[str, Any]:
        """The point's summary: time in ops, matmul and `other` shares per phase group, timer vs profiler."""
        steps = self.config.active
        metrics: dict[str, Any] = {"active_steps": steps, "threads": self.threads}
        for group in groups_of(self.config.step.workload.phases):
            total = group_seconds(self.work, group)
            shown = ("matmul", "attention", "moe", "other") if self.config.step.model.is_moe else (
                "matmul", "attention", "other")
            for category in shown:
                part = sum(w.seconds for w in self.work if w.category == category and w.phase in PHASE_GROUPS[group])
                metrics[f"{group}_{category}_pct"] = 100.0 * part / total if total else 0.0
            metrics[f"{group}_in_ops_ms"] = 1e3 * total / steps
        for row in timer_table(self.work, self.ranges, self.timer, steps).rows:
            metrics[f"{row['phase']}_timer_ms"] = row["timer_ms"]
            metrics[f"{row['phase']}_gap_ms"] = row["gap_ms"]
        return metrics


def profile_step(config: ProfileConfig, trace_path: str | Path | None = None) -> ProfileResult:
    """Profile one point; write the Chrome/Perfetto trace of the active steps to `trace_path` if given."""
    step_config = config.step
    device = resolve_device(step_config.device)
    naive = step_config.attention == "naive"
    with cpu_threads(step_config.threads) as threads:
        step = transformer_step(step_config.model, step_config.workload, attention=step_config.attention,
                            device=device, compile=step_config.compile, seed=step_config.seed,
                            moe_impl=step_config.moe_impl)
        if step_config.compile:
            step.compile_seconds()  # compile outside the profiled steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        collected: dict[str, Any] = {}

        def ready(profiler: torch.profiler.profile) -> None:
            collected["events"] = list(profiler.events())
            if trace_path is not None:
                profiler.export_chrome_trace(str(trace_path))

        with warnings.catch_warnings():
            # `--warmup 0` is the user's explicit choice, and torch warns about it on stderr at every point
            # ("Profiler won't be using warmup"); only that message is silenced, only while the schedule is built
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup", category=UserWarning)
            schedule = torch.profiler.schedule(wait=config.wait, warmup=step_config.warmup, active=config.active,
                                               repeat=1)
        region = phase_region(config.nvtx)
        total = config.wait + step_config.warmup + config.active
        # shapes and dtypes count the naive attention's FLOPs and bytes, and a written trace's ops (the roofline
        # and `calibrate --trace` read them)
        shapes = naive or trace_path is not None
        with quiet_native_stderr(), torch.profiler.profile(activities=activities, schedule=schedule,
                                                           on_trace_ready=ready, record_shapes=shapes) as profiler:
            active_range = contextlib.ExitStack()
            for index in range(total):
                if config.nvtx and index == config.wait + step_config.warmup:
                    active_range.enter_context(nvtx_range(ACTIVE_RANGE, True))
                step.prepare()
                step.run(region=region)
                synchronize(device)
                profiler.step()
            active_range.close()
        events = collected["events"]
        timer = time_phases(step, step_config.iters, device)
        del step
    return ProfileResult(config=config, work=attribute_work(events, device.type), ranges=phase_ranges(events),
                         timer=timer, device=device.type, threads=threads, events=events if naive else [],
                         trace_path=Path(trace_path) if trace_path is not None else None)


def run_profile_sweep(configs: list[ProfileConfig], out: str | Path | None = None, *, resume: bool = False,
                      trace: str | Path | None = None, with_memory: bool = False,
                      on_record: Callable[[dict[str, Any], ProfileConfig, ProfileResult | None], None]
                      = lambda record, config, result: None,
                      on_memory_record: Callable[[dict[str, Any], Any, Any], None]
                      = lambda record, config, result: None) -> SweepOutcome:
    """Profile every point. Per point, the table records go to `<out>/profile-*.jsonl` first, then the
    summary record to `<out>/profile.jsonl` (what --resume looks for); OOM points become `oom` rows. The
    Chrome trace of each point goes to `trace` (one file per point and rank). `with_memory`: then measure the
    memory of the same points as `stepscope memory` does (`on_memory_record` sees those records). Every point
    is validated and every file proven writable before any work."""
    from stepscope.measure.device import is_out_of_memory, release_memory
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.memory.benchmark import run_memory_sweep
    from stepscope.measure.memory.config import TABLE_KINDS as MEMORY_KINDS
    from stepscope.measure.memory.config import MemoryConfig
    from stepscope.measure.outputs import check_trace_apart, point_path, rank_path
    from stepscope.results.files import check_writable_file
    from stepscope.results.tables import append_tables, check_tables_writable

    for config in configs:
        config.validate()
    if trace is not None:
        traces = [rank_path(point_path(trace, index, len(configs))) for index in range(len(configs))]
        check_trace_apart(trace, traces, out, plots=with_memory)
        for path in traces:
            check_writable_file(path, "the trace")
    if out is not None:
        naive = any(config.step.attention == "naive" for config in configs)
        moe = any(config.step.model.is_moe for config in configs)
        kinds = ["profile", *(k for k in TABLE_KINDS if (naive or k != "profile-attention")
                              and (moe or k != "profile-moe"))]
        check_tables_writable(out, kinds + (["memory", *MEMORY_KINDS] if with_memory else []))
    device = resolve_device(configs[0].step.device)
    index_of = {id(config): i for i, config in enumerate(configs)}

    def env(config: ProfileConfig) -> dict[str, Any]:
        return torch_environment(device, threads=config.step.threads)

    def measure(config: ProfileConfig) -> tuple[dict[str, Any], ProfileResult]:
        path = rank_path(point_path(trace, index_of[id(config)], len(configs))) if trace is not None else None
        result = profile_step(config, path)
        if out is not None:
            append_tables(out, result.tables(), "profile", config.record_config(), env(config))
        return result.metrics(), result

    sweep = Sweep(kind="profile", points=configs, config_of=ProfileConfig.record_config, measure=measure,
                  env_of=env, is_oom=is_out_of_memory, after_oom=lambda: release_memory(device),
                  table_kinds=TABLE_KINDS)
    outcome = sweep.run(out, resume=resume, on_record=on_record)
    if with_memory:
        run_memory_sweep([MemoryConfig(step=config.step, top=config.top) for config in configs], out,
                         resume=resume, plot_dir=out, on_record=on_memory_record)
    return outcome
