"""The switch's job table: which jobs exist, who may create one, and what is kept of the finished ones.

Memory is bounded: at most `max_jobs` jobs, each within `max_job_bytes`; idle jobs expire. Admission when the
table is full: stray or forged JOINs must not lock real jobs out for `idle_s`. A job is *unproven* until it
completes its first block; a JOIN that needs a new job while the table is full evicts the unproven job silent
longest, if it has been silent for `evict_after_s`, and is rejected otherwise. Live ranks are never that silent:
they re-send JOIN every 10 ms until every rank joined, then send a keep-alive every second when they have nothing
else to send. Jobs that completed a block are never evicted (only forgotten after `idle_s`). A sustained flood of
more than `max_jobs / evict_after_s` new valid JOINs per second can still fill the table: that is an attack, for a
firewall in front of the port.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from stepscope.innet.switch.job import SwitchJob
from stepscope.innet.wire import protocol as p

SWITCH_TOTALS = ("rx", "tx", "bad", "tx_dropped", "internal_errors", "jobs_created", "jobs_finished",
                 "jobs_expired", "joins_rejected", "jobs_evicted")


class JobTable:
    """The jobs a switch serves and its own counters (`SWITCH_TOTALS`)."""

    def __init__(self, max_jobs: int, max_job_bytes: int, idle_s: float, evict_after_s: float,
                 finished_jobs_kept: int) -> None:
        self.max_jobs, self.max_job_bytes = max_jobs, max_job_bytes
        self.idle_s, self.evict_after_s, self.finished_jobs_kept = idle_s, evict_after_s, finished_jobs_kept
        self.jobs: dict[int, SwitchJob] = {}
        self.finished: OrderedDict[int, dict[str, int]] = OrderedDict()
        self.counters = {name: 0 for name in SWITCH_TOTALS}
        self.lock = threading.Lock()  # guards snapshots taken from other threads

    def join(self, h: p.Header, data: bytes, address: Any, key: int, dest: int, now: float) -> bytes:
        """A JOIN: create or join the job; the JOINED reply (or its rejection)."""
        def reject(reason: int) -> bytes:
            self.counters["joins_rejected"] += 1
            return p.pack(p.JOINED, h.job, 0, 0, 0, p.SWITCH_RANK, h.world, p.BAD, values=[reason])

        try:
            params = p.JoinParams.from_values(p.values_of(data, h.count))
        except p.ProtocolError:
            return reject(1)
        if params.problem() or not 1 <= h.world <= p.MAX_WORLD or h.job == 0:  # job 0: the switch's own stats
            return reject(1)
        if h.rank >= h.world:
            return reject(5)
        job = self.jobs.get(h.job)
        with self.lock:
            if job is None:
                if SwitchJob.memory_bytes(h.world, params) > self.max_job_bytes:
                    return reject(4)
                if len(self.jobs) >= self.max_jobs and not self._evict_for_new_job(now):
                    return reject(3)
                job = self.jobs[h.job] = SwitchJob(h.job, h.world, params, now)
                self.counters["jobs_created"] += 1
            elif job.world != h.world or job.params != params:
                return reject(2)
            elif job.members[h.rank] not in (None, address):
                return reject(6)  # nobody takes over a rank that is still in the job
            joined = job.join(h.rank, address, key, dest, now)
            if h.flags & p.SYNC:
                job.counters["sy"] += 1
        return p.pack(p.JOINED, h.job, 0, 0, 0, p.SWITCH_RANK, job.world, 0,
                      values=list(params.to_values()) + [joined])

    def leave(self, job: SwitchJob, rank: int, address: Any) -> None:
        with self.lock:
            if job.leave(rank, address):
                self.finish(job.job_id, "jobs_finished")

    def finish(self, job_id: int, reason: str) -> None:
        job = self.jobs.pop(job_id)
        self.counters[reason] += 1
        self.finished[job_id] = dict(job.counters)
        while len(self.finished) > self.finished_jobs_kept:
            self.finished.popitem(last=False)

    def _evict_for_new_job(self, now: float) -> bool:
        """Make room in a full table: forget the unproven job silent longest, if silent `evict_after_s`."""
        silent = [(job.last_active, job_id) for job_id, job in self.jobs.items()
                  if not job.proven and now - job.last_active >= self.evict_after_s]
        if not silent:
            return False
        self.finish(min(silent)[1], "jobs_evicted")
        return True

    def expire_idle(self, now: float) -> None:
        for job_id, job in list(self.jobs.items()):
            if now - job.last_active > self.idle_s:
                with self.lock:
                    self.finish(job_id, "jobs_expired")

    def totals(self) -> dict[str, int]:
        """The switch's counters, its number of live jobs and the CPU time of its process (the STATS reply for
        job 0)."""
        return {**self.counters, "jobs": len(self.jobs), "cpu_us": int(time.process_time() * 1e6)}

    def job_counters(self) -> dict[int, dict[str, int]]:
        """Counters of every job, live and finished (a copy)."""
        with self.lock:
            out = {job_id: dict(counters) for job_id, counters in self.finished.items()}
            out.update({job_id: dict(job.counters) for job_id, job in self.jobs.items()})
        return out

    def memory_bytes(self) -> int:
        """Upper bound of the memory the live jobs hold (safe to call from another thread)."""
        with self.lock:
            return sum(SwitchJob.memory_bytes(job.world, job.params) for job in self.jobs.values())
