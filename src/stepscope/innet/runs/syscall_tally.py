"""`stepscope innet bench --tally syscalls`: what in-network aggregation and gloo do beneath their APIs.

After the benchmark ran as usual (its timings are the command's), it runs again under strace with every rank
marking its timed rounds (`bench._time_cell`), each implementation under its own mark, so one traced run tallies
both; the switch process, a child of the run, is counted over the ranks' marked rounds. One `innet-bench` record
per implementation, size and mode (config `"record": "syscalls"`, the metrics of
`distributed.collectives.syscall_tally.tally_metrics`), its time per all-reduce traced beside the untraced one.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.syscall_tally import TRACER, tally_metrics
from stepscope.distributed.tracing.strace import find_strace, trace_program
from stepscope.distributed.tracing.windows import find_windows, tally_window, window_name
from stepscope.errors import UsageError
from stepscope.results.store import RecordStore, make_record

JOB_MODULE = "stepscope.innet.runs.syscall_job"
TRACE_TIMEOUT_S = 1800.0
"""The traced benchmark's bound (its ranks have the launcher's own, much shorter, timeouts)."""


def check_tracer() -> str:
    """strace's path; UsageError when it is absent or not permitted, or the ranks are not started here."""
    from stepscope.distributed.launch.ranks import external_launch_env

    if external_launch_env() is not None:
        raise UsageError("--tally syscalls traces the ranks stepscope starts itself; run it without torchrun/srun")
    return find_strace()


def trace_bench(config: Any, rows: list[dict[str, Any]], *, strace: str) -> list[dict[str, Any]]:
    """The `syscalls` records of `config` (a BenchConfig) from a run of it under strace; `rows`: the untraced
    run's rows (their latencies stand beside the traced ones)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-strace-") as folder:
        tmp = Path(folder)
        plan = dataclasses.replace(config, syscalls=False)
        (tmp / "plan.pkl").write_bytes(pickle.dumps(plan))
        threads = trace_program(strace, tmp / "t", [sys.executable, "-m", JOB_MODULE, str(tmp / "plan.pkl"),
                                                    str(tmp / "out")],
                                timeout_s=TRACE_TIMEOUT_S, what=f"innet bench on {config.world} ranks")
        traced_rows = [r["metrics"] | {"size_bytes": r["config"]["size_bytes"], "mode": r["config"]["mode"]}
                       for r in RecordStore(tmp / "out", "innet-bench").records()]
    windows = find_windows(threads)
    records = []
    for size in config.sizes_bytes:
        for mode in config.modes:
            ops = config.batch if mode == "batch" else 1
            for impl in ("innet", "gloo") if config.gloo else ("innet",):
                window = windows.get(window_name(f"{impl}:{size}:{mode}"))
                if window is None:
                    continue
                traced, plain = (_latency_us(r, impl, size, mode) for r in (traced_rows, rows))
                point = {"record": "syscalls", "tracer": TRACER, "backend": impl, "op": "all_reduce",
                         "world_size": config.world, "size_bytes": size, "dtype": config.dtype, "mode": mode,
                         "iters": config.iters * ops}
                records.append(make_record("innet-bench", point, tally_metrics(tally_window(threads, window),
                                                                               traced, plain)))
    return records


def _latency_us(rows: list[dict[str, Any]], impl: str, size: int, mode: str) -> float | None:
    """Median time per all-reduce (slowest rank) of one cell, in µs."""
    for row in rows:
        if row.get("size_bytes") == size and row.get("mode") == mode and row.get(f"{impl}_latency_ms_median"):
            return row[f"{impl}_latency_ms_median"] * 1e3
    return None
