"""A benchmark run again under strace, its marked windows tallied as records: the one helper behind `stepscope
comm --tally syscalls` and `stepscope innet bench --tally syscalls`.

After the benchmark ran as usual (its timings are the command's, untouched), `trace_run` runs the same library
function again under strace (`strace.trace_program`) through `traced_job`, its config handed over as a JSON plan,
its records written to a temporary folder, every rank marking its timed calls (`windows`). The caller names the
windows of its points; `syscall_record` makes one record per point (config `"record": "syscalls"`): calls, time
and bytes per kind (`syscall_kinds`) over every rank and helper process, the processes and threads alive, and the
time per call traced and untraced with their ratio, the tracer's overhead made visible.

    run = trace_run(strace, run_comm, plan, "comm", timeout_s=600, what="gloo on 2 ranks")
    tally = run.tally(key)                                  # None: no window of that name
    record = syscall_record("comm", point, tally, traced_us, untraced_us)
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.distributed.tracing.plan import plan_json
from stepscope.distributed.tracing.strace import ThreadTrace, trace_program
from stepscope.distributed.tracing.windows import Window, find_windows, tally_window, window_name
from stepscope.results.store import RecordStore, make_record

TRACER = "strace"
JOB_MODULE = "stepscope.distributed.tracing.traced_job"


@dataclass
class TracedRun:
    """A traced run: every thread's calls, the windows its ranks marked, and the records it wrote."""

    threads: dict[int, ThreadTrace]
    windows: dict[str, Window]
    records: list[dict[str, Any]]

    def tally(self, key: str) -> dict[str, Any] | None:
        """The calls inside the window the ranks marked as `key` (`windows.tally_window`); None: no such window."""
        window = self.windows.get(window_name(key))
        return None if window is None else tally_window(self.threads, window)


def trace_run(strace: str, function: Callable[..., Any], config: Any, kind: str, *, timeout_s: float,
              what: str) -> TracedRun:
    """`function(config, out)` run under strace in a child program; its `kind` records read back. `what` names
    the run in errors (DistributedError when it fails or outlives `timeout_s`)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-strace-") as folder:
        tmp = Path(folder)
        (tmp / "plan.json").write_text(plan_json(config))
        target = f"{function.__module__}:{function.__qualname__}"
        argv = [sys.executable, "-m", JOB_MODULE, target, str(tmp / "plan.json"), str(tmp / "out")]
        threads = trace_program(strace, tmp / "t", argv, timeout_s=timeout_s, what=what)
        records = RecordStore(tmp / "out", kind).records()
    return TracedRun(threads, find_windows(threads), records)


def syscall_record(kind: str, point: dict[str, Any], tally: dict[str, Any], traced_us: float | None,
                   untraced_us: float | None, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """One `syscalls` record of `kind` for a point (its config), from its window's tally."""
    return make_record(kind, {**point, "record": "syscalls", "tracer": TRACER},
                       tally_metrics(tally, traced_us, untraced_us), env=env)


def tally_metrics(tally: dict[str, Any], traced_us: float | None, untraced_us: float | None) -> dict[str, Any]:
    """A window's tally as record metrics: per kind calls, time and bytes, the totals, the processes and threads,
    and the time per call traced and untraced with their ratio."""
    metrics: dict[str, Any] = {"hostnames": 1, "processes": tally["processes"], "threads": tally["threads"],
                               "active_threads": tally["active_threads"], "rank_tasks": tally["rank_tasks"],
                               "programs": tally["programs"], "window_s": tally["window_s"]}
    for kind, slot in tally["kinds"].items():
        metrics[f"{kind}_calls"] = slot["calls"]
        metrics[f"{kind}_time_us"] = slot["time_us"]
        if kind in ("send", "recv", "copy", "memory"):
            metrics[f"{kind}_bytes"] = slot["bytes"]
    metrics["calls"] = sum(slot["calls"] for slot in tally["kinds"].values())
    metrics["time_us"] = sum(slot["time_us"] for slot in tally["kinds"].values())
    metrics["errors"] = sum(slot["errors"] for slot in tally["kinds"].values())
    metrics.update({"traced_time_us": traced_us, "untraced_time_us": untraced_us,
                    "overhead_x": traced_us / untraced_us if traced_us and untraced_us else None,
                    "syscalls": tally["syscalls"]})
    return metrics
