"""`stepscope innet bench --tally syscalls`: what in-network aggregation and gloo do beneath their APIs.

After the benchmark ran as usual (its timings are the command's), it runs again under strace
(`distributed.tracing.tally.trace_run`) with every rank marking its timed rounds (`bench._time_cell`), each
implementation under its own mark, so one traced run tallies both; the switch process, a child of the run, is
counted over the ranks' marked rounds. One `innet-bench` record per implementation, size and mode (config
`"record": "syscalls"`, `tracing.tally.syscall_record`), its time per all-reduce traced beside the untraced one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepscope.distributed.tracing.tally import syscall_record, trace_run

TRACE_TIMEOUT_S = 1800.0
"""The traced benchmark's bound (its ranks have the launcher's own, much shorter, timeouts)."""


def trace_bench(config: Any, rows: list[dict[str, Any]], *, strace: str) -> list[dict[str, Any]]:
    """The `syscalls` records of `config` (a BenchConfig) from a run of it under strace; `rows`: the untraced
    run's rows (their latencies stand beside the traced ones)."""
    from stepscope.innet.runs.bench import run_bench

    run = trace_run(strace, run_bench, dataclasses.replace(config, syscalls=False), "innet-bench",
                    timeout_s=TRACE_TIMEOUT_S, what=f"innet bench on {config.world} ranks")
    traced_rows = [r["metrics"] | {"size_bytes": r["config"]["size_bytes"], "mode": r["config"]["mode"]}
                   for r in run.records]
    records = []
    for size in config.sizes_bytes:
        for mode in config.modes:
            ops = config.batch if mode == "batch" else 1
            for impl in ("innet", "gloo") if config.gloo else ("innet",):
                tally = run.tally(f"{impl}:{size}:{mode}")
                if tally is None:
                    continue
                traced, plain = (_latency_us(r, impl, size, mode) for r in (traced_rows, rows))
                point = {"backend": impl, "op": "all_reduce", "world_size": config.world, "size_bytes": size,
                         "dtype": config.dtype, "mode": mode, "iters": config.iters * ops}
                records.append(syscall_record("innet-bench", point, tally, traced, plain))
    return records


def _latency_us(rows: list[dict[str, Any]], impl: str, size: int, mode: str) -> float | None:
    """Median time per all-reduce (slowest rank) of one cell, in µs."""
    for row in rows:
        if row.get("size_bytes") == size and row.get("mode") == mode and row.get(f"{impl}_latency_ms_median"):
            return row[f"{impl}_latency_ms_median"] * 1e3
    return None
