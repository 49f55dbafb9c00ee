"""`stepscope comm --tally syscalls`: what each backend does beneath its API, from the system calls of a traced run.

After a job is measured as usual (those timings are the command's, untouched), the same job runs again under
strace (`tracing.strace`) with every rank marking its timed calls (`rank.mark_key`, `tracing.windows`). Per
point, the calls inside the marks are tallied per kind (network send/receive, copies between processes,
polling, synchronisation, memory mapping, thread creation) over every rank and helper process, together with
the processes and threads alive during the calls. Each point gives one record (config `"record": "syscalls"`,
in `comm.jsonl`) with the totals over its `iters` calls, the traced and the untraced time per call and their
ratio: the tracer's overhead, made visible.

    tallies = trace_job(job, config, strace=find_strace(), untraced=result.records)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.benchmark import Job
from stepscope.distributed.collectives.config import CommConfig
from stepscope.distributed.collectives.rank import mark_key
from stepscope.distributed.tracing.strace import trace_program
from stepscope.distributed.tracing.windows import find_windows, tally_window, window_name
from stepscope.results.store import RecordStore, make_record

JOB_MODULE = "stepscope.distributed.collectives.syscall_job"
TRACER = "strace"


def trace_job(job: Job, config: CommConfig, *, strace: str,
              untraced: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `syscalls` record per point of `job` that was timed, from a run of the job under strace;
    `untraced`: the job's records from the ordinary run (their times stand beside the traced ones)."""
    plain = {r["key"]: r for r in untraced}
    with tempfile.TemporaryDirectory(prefix="stepscope-strace-") as folder:
        tmp = Path(folder)
        plan = dataclasses.asdict(dataclasses.replace(config, backends=(job.backend,), worlds=(job.world_size,),
                                                      syscalls=False, tally=False))
        (tmp / "plan.json").write_text(json.dumps(plan))
        threads = trace_program(strace, tmp / "t", [sys.executable, "-m", JOB_MODULE, str(tmp / "plan.json"),
                                                    str(tmp / "out")],
                                timeout_s=config.timeout_s * (2 + len(job.points)),
                                what=f"{job.backend} on {job.world_size} ranks")
        traced = {r["key"]: r for r in RecordStore(tmp / "out", "comm").records()}
    windows = find_windows(threads)
    records = []
    for point in job.points:
        key = make_record("comm", point.config())["key"]
        window = windows.get(window_name(mark_key(point)))
        if window is None or key not in traced:  # unsupported or oom: no timed calls to tally
            continue
        tally = tally_window(threads, window)
        records.append(_record(point.config(), tally, traced[key], plain.get(key)))
    return records


def _record(point_config: dict[str, Any], tally: dict[str, Any], traced: dict[str, Any],
            plain: dict[str, Any] | None) -> dict[str, Any]:
    config = {**point_config, "record": "syscalls", "tracer": TRACER}
    metrics = tally_metrics(tally, traced["metrics"].get("time_us_max"),
                            plain["metrics"].get("time_us_max") if plain else None)
    return make_record("comm", config, metrics, env=traced.get("env"))


def tally_metrics(tally: dict[str, Any], traced_us: float | None, untraced_us: float | None) -> dict[str, Any]:
    """A window's tally (`tracing.windows.tally_window`) as record metrics: per kind calls, time and bytes, the
    totals, the processes and threads, and the time per call traced and untraced with their ratio."""
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
