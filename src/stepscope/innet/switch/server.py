"""The software switch: one UDP socket, one packet thread, a table of jobs (`SwitchJob`), and timers.

    switch = Switch(SwitchConfig(port=0)); switch.start()      # in-process thread (tests)
    Switch(SwitchConfig(port=9000)).serve_forever(stop_event)  # the `stepscope innet switch` process

Robustness: every datagram is validated before it touches a job; malformed ones, packets for unknown jobs,
from ranks outside a job or from another address than the rank joined with are dropped and counted.
Memory is bounded: at most `max_jobs` jobs, each within `max_job_bytes`; idle jobs expire. The loop waits
on the socket with a timeout (timers, shutdown), so a stop request ends it within `poll_s`.

Admission when the table is full: stray or forged JOINs must not lock real jobs out for `idle_s`. A job is
*unproven* until it completes its first block; a JOIN that needs a new job while the table is full evicts
the unproven job silent longest, if it has been silent for `evict_after_s`, and is rejected otherwise.
Live ranks are never that silent: they re-send JOIN every 10 ms until every rank joined, then send a
keep-alive every second when they have nothing else to send. Jobs that completed a block are never
evicted (only forgotten after `idle_s`). A sustained flood of more than `max_jobs / evict_after_s` new
valid JOINs per second can still fill the table: that is an attack, for a firewall in front of the port.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.innet.switch.job import Send, SwitchJob
from stepscope.innet.wire import protocol as p

RECV_BUFFER_BYTES = 4 << 20  # loopback bursts of a whole window must not overflow the socket


@dataclass(frozen=True)
class SwitchConfig:
    """Where the switch listens and how much it may hold."""

    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 to serve other machines)."""
    port: int = 9000
    """UDP port; 0 lets the OS pick (the chosen port is in `Switch.address`)."""
    max_jobs: int = 64
    """Jobs served at once; a JOIN beyond this is rejected."""
    max_job_bytes: int = 256 << 20
    """Memory one job may take (slots x values x 2 versions, stored results, history)."""
    idle_s: float = 300.0
    """A job without any packet for this long is forgotten (its ranks are gone)."""
    evict_after_s: float = 5.0
    """With the table full, a new job may evict a job that never completed a block and was silent this long."""
    poll_s: float = 0.05
    """Longest wait on the socket, so a stop request is seen promptly."""
    finished_jobs_kept: int = 256
    """Counters of finished jobs kept for the exit summary."""

    def validate(self) -> None:
        if not 0 <= self.port < 65_536:
            raise UsageError(f"--port must be 0..65535, got {self.port}")


class Switch:
    """A software aggregation switch serving several jobs at once."""

    def __init__(self, config: SwitchConfig = SwitchConfig()) -> None:
        self.config = config
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RECV_BUFFER_BYTES)
        self.sock.bind((config.host, config.port))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()
        self.jobs: dict[int, SwitchJob] = {}
        self.finished: OrderedDict[int, dict[str, int]] = OrderedDict()
        self.counters = {"rx": 0, "tx": 0, "bad": 0, "tx_dropped": 0, "internal_errors": 0, "jobs_created": 0,
                         "jobs_finished": 0, "jobs_expired": 0, "joins_rejected": 0, "jobs_evicted": 0}
        self.lock = threading.Lock()  # guards snapshots taken from other threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Switch:
        """Serve on a background thread (in-process use: tests, notebooks)."""
        self._thread = threading.Thread(target=self.serve_forever, name="innet-switch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.sock.close()

    def __enter__(self) -> Switch:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def request_stop(self) -> None:
        self._stop.set()

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        next_timer_check = 0.0
        next_idle_check = time.monotonic() + 1.0
        while not stop.is_set() and not self._stop.is_set():
            now = time.monotonic()
            wait = self.config.poll_s
            deadline = self._next_deadline()
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            readable, _, _ = select.select([self.sock], [], [], wait)
            if readable:
                self._drain()
            now = time.monotonic()
            if now >= next_timer_check:
                # the timer scan runs at most once per tick: the switch's timer resolution
                next_timer_check = now + p.TICK_S
                for job in list(self.jobs.values()):
                    if job.timers:
                        self._send(job.expire(now))
            if now >= next_idle_check:
                next_idle_check = now + 1.0
                self._expire_idle(now)

    def _next_deadline(self) -> float | None:
        deadlines = [d for d in (job.next_deadline() for job in self.jobs.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def _drain(self) -> None:
        """Handle every queued datagram (bounded, so timers still run under a flood)."""
        for _ in range(4096):
            try:
                data, address = self.sock.recvfrom(65_535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. an ICMP error queued on the socket; nothing to read
            self.counters["rx"] += 1
            try:
                sends = self.handle(data, address, time.monotonic())
            except Exception:  # noqa: BLE001 - one bad datagram must never stop the switch
                self.counters["internal_errors"] += 1
                self.counters["bad"] += 1
                continue
            self._send(sends)

    def _send(self, sends: list[Send]) -> None:
        for packet, receivers in sends:
            for address in receivers:
                try:
                    self.sock.sendto(packet, address)
                    self.counters["tx"] += 1
                except OSError:
                    # a full socket buffer or an unreachable worker: a switch drops, the sender retransmits
                    self.counters["tx_dropped"] += 1

    # ---- packets ---------------------------------------------------------------------------------------
    def handle(self, data: bytes, address: Any, now: float) -> list[Send]:
        """Process one datagram; returns the datagrams to send."""
        try:
            h = p.unpack(data)
        except p.ProtocolError:
            self.counters["bad"] += 1
            return []
        if h.type == p.JOIN:
            return self._join(h, data, address, now)
        if h.type == p.STATS and h.job == 0:
            totals = {**self.counters, "jobs": len(self.jobs)}
            reply = p.pack(p.STATS_REPLY, 0, 0, 0, 0, p.SWITCH_RANK, 0, 0,
                           values=p.stats_payload(totals, p.SWITCH_COUNTERS))
            return [(reply, [address])]
        job = self.jobs.get(h.job)
        if job is None or h.world != job.world or h.rank >= job.world:
            self.counters["bad"] += 1  # unknown job, or a rank that is not part of it
            if job is not None:
                job.counters["bad"] += 1
            return []
        if h.type == p.DATA:
            with self.lock:
                bad = job.counters["bad"]
                sends = job.contribute(h, data, address, now)
                self.counters["bad"] += job.counters["bad"] - bad
                return sends
        if h.type == p.LEAVE and job.members[h.rank] is None:
            return []  # a repeated LEAVE
        if job.members[h.rank] != address:
            job.counters["bad"] += 1
            self.counters["bad"] += 1
            return []
        if h.type == p.LEAVE:
            with self.lock:
                if job.leave(h.rank, address):
                    self._finish(h.job, "jobs_finished")
            return []
        if h.type == p.STATS:  # also the workers' keep-alive: a job between all-reduces is not idle
            job.last_active = now
            reply = p.pack(p.STATS_REPLY, h.job, h.op, 0, 0, p.SWITCH_RANK, job.world, 0,
                           values=p.stats_payload(job.counters))
            return [(reply, [address])]
        self.counters["bad"] += 1  # a worker never sends RESULT, JOINED, STATUS or STATS_REPLY
        return []

    def _join(self, h: p.Header, data: bytes, address: Any, now: float) -> list[Send]:
        def reject(reason: int) -> list[Send]:
            self.counters["joins_rejected"] += 1
            reply = p.pack(p.JOINED, h.job, 0, 0, 0, p.SWITCH_RANK, h.world, p.BAD, values=[reason])
            return [(reply, [address])]

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
                if SwitchJob.memory_bytes(h.world, params) > self.config.max_job_bytes:
                    return reject(4)
                if len(self.jobs) >= self.config.max_jobs and not self._evict_for_new_job(now):
                    return reject(3)
                job = self.jobs[h.job] = SwitchJob(h.job, h.world, params, now)
                self.counters["jobs_created"] += 1
            elif job.world != h.world or job.params != params:
                return reject(2)
            elif job.members[h.rank] not in (None, address):
                return reject(6)  # nobody takes over a rank that is still in the job
            joined = job.join(h.rank, address, now)
            if h.flags & p.SYNC:
                job.counters["sy"] += 1
        reply = p.pack(p.JOINED, h.job, 0, 0, 0, p.SWITCH_RANK, job.world, 0,
                       values=list(params.to_values()) + [joined])
        return [(reply, [address])]

    def _finish(self, job_id: int, reason: str) -> None:
        job = self.jobs.pop(job_id)
        self.counters[reason] += 1
        self.finished[job_id] = dict(job.counters)
        while len(self.finished) > self.config.finished_jobs_kept:
            self.finished.popitem(last=False)

    def _evict_for_new_job(self, now: float) -> bool:
        """Make room in a full table: forget the unproven job silent longest, if silent `evict_after_s`."""
        silent = [(job.last_active, job_id) for job_id, job in self.jobs.items()
                  if not job.proven and now - job.last_active >= self.config.evict_after_s]
        if not silent:
            return False
        self._finish(min(silent)[1], "jobs_evicted")
        return True

    def _expire_idle(self, now: float) -> None:
        for job_id, job in list(self.jobs.items()):
            if now - job.last_active > self.config.idle_s:
                with self.lock:
                    self._finish(job_id, "jobs_expired")

    # ---- reporting -------------------------------------------------------------------------------------
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
