"""`stepscope comm --tally syscalls`: what each backend does beneath its API, from the system calls of a traced run.

After a job is measured as usual, the same job runs again under strace (`tracing.tally.trace_run`) with every
rank marking its timed calls (`rank.mark_key`). Per point, the calls inside the marks give one record (config
`"record": "syscalls"`, in `comm.jsonl`; `tracing.tally.syscall_record`) with the totals over its `iters` calls,
the traced and the untraced time per call and their ratio.

    tallies = trace_job(job, config, strace=find_strace(), untraced=result.records)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepscope.distributed.collectives.benchmark import Job
from stepscope.distributed.collectives.config import CommConfig
from stepscope.distributed.collectives.rank import mark_key
from stepscope.distributed.tracing.tally import syscall_record, trace_run
from stepscope.results.store import make_record


def trace_job(job: Job, config: CommConfig, *, strace: str,
              untraced: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `syscalls` record per point of `job` that was timed, from a run of the job under strace;
    `untraced`: the job's records from the ordinary run (their times stand beside the traced ones)."""
    from stepscope.distributed.collectives.session import run_comm

    plain = {r["key"]: r for r in untraced}
    plan = dataclasses.replace(config, backends=(job.backend,), worlds=(job.world_size,), syscalls=False,
                               tally=False)
    run = trace_run(strace, run_comm, plan, "comm", timeout_s=config.timeout_s * (2 + len(job.points)),
                    what=f"{job.backend} on {job.world_size} ranks")
    traced = {r["key"]: r for r in run.records}
    records = []
    for point in job.points:
        key = make_record("comm", point.config())["key"]
        tally = run.tally(mark_key(point))
        if tally is None or key not in traced:  # unsupported or oom: no timed calls to tally
            continue
        untraced_us = plain[key]["metrics"].get("time_us_max") if key in plain else None
        records.append(syscall_record("comm", point.config(), tally, traced[key]["metrics"].get("time_us_max"),
                                      untraced_us, env=traced[key].get("env")))
    return records
