"""`stepscope innet timeout-profile`: how the straggler timeout (STO) interacts with the natural skew
between workers, on the emulator (real switch process, real ranks, no injected straggler by default).

For every STO (ms, shown with its tick count) and worker retransmission timeout, a fresh job runs three
workloads: one op; `ops` ops each waited; `ops` ops issued together (batch). Per cell the switch's
`ok / to` block counts go into a table laid out like DPA's published one (rows: STO, columns: workloads),
and the throughput of the waited workload into a table per (STO, RTO). With K < world, blocks that
complete by the timeout although nobody straggles show that the STO is below the natural skew.

`--straggler` injects a straggler on top: its steps are the ops of each cell (0-based, in issue order), and
a straggling rank sleeps before issuing that op, inside the timed region (as in `innet bench`). Every cell
draws the same straggle decisions (the generator restarts per cell), so cells differ only in STO and RTO.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.innet.runs.reference import reference_input
from stepscope.innet.runs.runner import RunOutcome, check_job, record_settings, run_ranks, start_run
from stepscope.innet.wire.protocol import sto_ticks_from_ms
from stepscope.innet.worker.client import InnetJob
from stepscope.innet.worker.config import JobConfig, shared_job_id
from stepscope.results.store import RecordStore, make_record

WORKLOADS = ("one", "waited", "batch")
WORKLOAD_TITLES = {"one": "1 op", "waited": "{ops} ops waited", "batch": "{ops} ops batch"}


@dataclass(frozen=True)
class ProfileConfig:
    """One timeout-profile sweep."""

    world: int = 3
    """Ranks."""
    k: int | None = None
    """Fastest-K (None = world - 1: tolerance on, so the timer can complete blocks)."""
    sto_ms: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 12.5)
    """Straggler timeouts to sweep (rounded up to 65.536 us ticks)."""
    rto_ms: tuple[float, ...] = (2.0, 20.0)
    """Worker retransmission timeouts; the ok/to table uses the first."""
    size_bytes: int = 16 << 10
    """Bytes per op."""
    ops: int = 100
    """Ops of the waited and batch workloads."""
    workloads: tuple[str, ...] = WORKLOADS
    """Workloads of the ok/to table."""
    seed: int = 0
    """Seed of the inputs."""
    job: JobConfig = field(default_factory=JobConfig)
    """Packet settings and faults (the switch, STO, RTO, rank, world and job id set per cell)."""

    @property
    def min_count(self) -> int:
        return self.k if self.k is not None else max(1, self.world - 1)

    def validate(self) -> None:
        if self.world < 2:
            raise UsageError("--world must be at least 2")
        if not 1 <= self.min_count <= self.world:
            raise UsageError(f"-k must be 1..world ({self.world})")
        if not self.sto_ms or any(s < 0 for s in self.sto_ms) or not self.rto_ms or any(r <= 0 for r in self.rto_ms):
            raise UsageError("--sto-ms values must be >= 0 and --rto-ms values > 0")
        if self.size_bytes < 4 or self.size_bytes % 4 or self.ops < 1:
            raise UsageError("--size must be a multiple of 4 bytes and --ops >= 1")
        if any(w not in WORKLOADS for w in self.workloads) or not self.workloads:
            raise UsageError(f"--workload must be among {', '.join(WORKLOADS)}")
        check_job(self.job, self.world)  # the template as given, then as each RTO of the sweep runs it
        for rto in self.rto_ms:
            check_job(self.job, self.world, rto_ms=rto, rto_max_ms=max(rto, self.job.rto_max_ms))
        for sto in self.sto_ms:  # each STO of the sweep as the ranks run it (finite, within the switch's timer)
            check_job(self.job, self.world, sto_ms=sto, sto_ticks=None)

    def to_dict(self) -> dict[str, Any]:
        return record_settings(self)

    def cells(self) -> list[tuple[float, float, str]]:
        """(STO, RTO, workload): all workloads at the first RTO, the waited one at the others."""
        out = []
        for sto in self.sto_ms:
            for index, rto in enumerate(self.rto_ms):
                workloads = self.workloads if index == 0 else ("waited",)
                out.extend((sto, rto, w) for w in workloads)
        return out


def profile_rank(ctx: Any, config: ProfileConfig, out: str | os.PathLike | None) -> list[dict[str, Any]]:
    """One rank of the sweep; rank 0 returns a row per cell and appends its record to
    `<out>/innet-timeout-profile.jsonl` at once."""
    import torch.distributed as dist

    from stepscope.measure.environment import torch_environment

    numel = config.size_bytes // 4
    source = reference_input(config.seed, ctx.rank, numel, "fp32")
    buffers = [np.empty_like(source) for _ in range(config.ops)]
    store = RecordStore(out, "innet-timeout-profile") if out is not None and ctx.rank == 0 else None
    env = torch_environment("cpu", ctx.world_size) if ctx.rank == 0 else {}
    straggler = config.job.faults.straggler
    rows = []
    for sto, rto, workload in config.cells():
        job_config = replace(config.job, rank=ctx.rank, world=ctx.world_size, job_id=shared_job_id(), sto_ms=sto,
                             sto_ticks=None, rto_ms=rto, rto_max_ms=max(rto, config.job.rto_max_ms))
        with InnetJob(job_config, log=lambda _: None) as job:
            count = 1 if workload == "one" else config.ops
            for buffer in buffers[:count]:
                buffer[:] = source
            rng = random.Random(config.seed * 7919 + ctx.rank)  # the same straggle decisions in every cell
            delays = [straggler.delay_for(ctx.rank, step, rng) if straggler else 0.0 for step in range(count)]
            dist.barrier()
            start = time.perf_counter()
            if workload == "batch":
                pendings = []
                for delay, buffer in zip(delays, buffers[:count], strict=True):
                    if delay:
                        time.sleep(delay)  # this rank straggles: this op (and those after it) issue late
                    pendings.append(job.submit(buffer, "avg", config.min_count))
                for pending in pendings:
                    pending.wait()
            else:
                for delay, buffer in zip(delays, buffers[:count], strict=True):
                    if delay:
                        time.sleep(delay)
                    job.all_reduce(buffer, "avg", config.min_count)
            seconds = time.perf_counter() - start
            times: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(times, seconds)
            if ctx.rank == 0:
                counters = job.stats()
                row = {"sto_ms": sto, "sto_ticks": sto_ticks_from_ms(sto), "rto_ms": rto, "workload": workload,
                       "ok": counters["ok"], "to": counters["to"], "re": counters["re"], "dup": counters["dup"],
                       "old": counters["old"], "seconds": max(times),
                       "algbw_GBps": config.size_bytes * count / max(times) / 1e9}
                rows.append(row)
                if store is not None:
                    store.append(make_record("innet-timeout-profile", {**config.to_dict(), "sto_ms": sto,
                                                                       "rto_ms": rto, "workload": workload},
                                             {k: v for k, v in row.items() if k not in ("sto_ms", "rto_ms",
                                                                                          "workload")}, env=env))
            dist.barrier()  # nobody leaves the job before rank 0 read the counters
    return rows


def run_profile(config: ProfileConfig, out: str | os.PathLike | None = None, *,
                switch: str | None = None) -> RunOutcome[ProfileConfig] | None:
    """Run the sweep on `config.world` launched ranks (under torchrun/Slurm: theirs) against the running
    switch at `switch` (None: a switch process started for the run; required under torchrun/Slurm), one
    `innet-timeout-profile` record per cell in `<out>` (None: none). Rank 0's outcome; None on the other
    ranks under torchrun/Slurm."""
    config, store = start_run(config, out, switch, "innet-timeout-profile")
    results = run_ranks(profile_rank, config, out, out=out, switch=switch, timeout_s=300)
    return None if results is None else RunOutcome(config, results[0], None if store is None else store.path)


def profile_table(rows: Iterable[dict[str, Any]], ops: int, key: str = "rto_ms") -> list[dict[str, Any]]:
    """DPA's layout: one row per STO ('ms (ticks)'), one column per workload, cells 'ok / to'."""
    rows = list(rows)
    first = rows[0].get(key) if rows else None
    table: dict[float, dict[str, Any]] = {}
    for row in rows:
        if row.get(key) != first:
            continue
        line = table.setdefault(row["sto_ms"], {"STO ms (ticks)": f"{row['sto_ms']:g} ({row['sto_ticks']})"})
        line[WORKLOAD_TITLES[row["workload"]].format(ops=ops)] = f"{row['ok']} / {row['to']}"
    return list(table.values())


def throughput_table(rows: Iterable[dict[str, Any]], workload: str = "waited") -> list[dict[str, Any]]:
    """Throughput (Gb/s) of one workload: rows STO, columns worker RTO."""
    table: dict[float, dict[str, Any]] = {}
    for row in rows:
        if row["workload"] != workload:
            continue
        line = table.setdefault(row["sto_ms"], {"STO ms (ticks)": f"{row['sto_ms']:g} ({row['sto_ticks']})"})
        line[f"RTO {row['rto_ms']:g} ms GB/s"] = row["algbw_GBps"]
    return list(table.values())
