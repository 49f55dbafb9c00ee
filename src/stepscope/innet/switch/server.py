"""The software switch: one UDP socket, one packet thread, a table of jobs (`table.JobTable`), and timers.

    switch = Switch(SwitchConfig(port=0)); switch.start()      # in-process thread (tests)
    Switch(SwitchConfig(port=9000)).serve_forever(stop_event)  # the `stepscope innet switch` process

A batch at a time: one `recvmmsg` call (`wire.batch_io`) fills preallocated buffers with every queued datagram,
their headers parse into one numpy array, and each job's DATA packets are applied together (`aggregate`); what
they complete leaves in one `sendmmsg` call. With the C fast path (`wire.fastpath`), the batch's DATA packets
go through C one at a time instead (`fast_batch`), on the same job state. Control packets (JOIN, LEAVE,
STATS) are handled one by one, in their place: a batch is cut at each, so a DATA packet sent before its rank's
JOIN is still refused.

Robustness: every datagram is validated before it touches a job; malformed ones, packets for unknown jobs,
from ranks outside a job or from another address than the rank joined with are dropped and counted. The loop
waits on the socket with a timeout (timers, shutdown), so a stop request ends it within `poll_s`.
"""

from __future__ import annotations

import ctypes
import select
import socket
import threading
import time
from typing import Any

import numpy as np

from stepscope.innet.switch.aggregate import contribute
from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.fast_batch import FastBatches
from stepscope.innet.switch.job import SwitchJob
from stepscope.innet.switch.outbox import Outbox
from stepscope.innet.switch.table import JobTable
from stepscope.innet.wire import batch_io, fastpath
from stepscope.innet.wire import protocol as p

RECV_BUFFER_BYTES = 4 << 20  # loopback bursts of a whole window must not overflow the socket


def keep_freed_memory() -> None:
    """Have glibc keep freed blocks of up to 256 MiB in the heap instead of returning them to the kernel.

    A batch's numpy temporaries are megabytes; by default glibc maps each afresh and unmaps it when freed, so every
    batch pays page faults and the kernel's zeroing of new pages, which measured on the packet path cost more than
    the arithmetic (docs/innet.md). A packet-processing process sets this once (a no-op off glibc)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    mallopt(m_mmap_threshold, 256 << 20)
    mallopt(m_trim_threshold, 1 << 30)
    mallopt(m_top_pad, 64 << 20)


class Switch:
    """A software aggregation switch serving several jobs at once. `data_path`: 'c' or 'numpy' (None: the
    environment's choice, `wire.fastpath`)."""

    def __init__(self, config: SwitchConfig | None = None, data_path: str | None = None) -> None:
        keep_freed_memory()
        self.config = config = config or SwitchConfig()
        self.native = native = fastpath.resolve(data_path)
        self.fast = FastBatches(native, self) if native is not None else None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RECV_BUFFER_BYTES)
        self.sock.bind((config.host, config.port))
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()
        path = fastpath.name(native)
        self.receiver = batch_io.Receiver(self.sock, sources=True, gro=config.offload, data_path=path)
        self.sender = batch_io.Sender(self.sock, gso=config.offload, data_path=path)
        self.table = JobTable(config.max_jobs, config.max_job_bytes, config.idle_s, config.evict_after_s,
                              config.finished_jobs_kept)
        self._names: dict[int, Any] = {}  # destination index -> address (for `handle`'s answers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def jobs(self) -> dict[int, SwitchJob]:
        return self.table.jobs

    @property
    def counters(self) -> dict[str, int]:
        return self.table.counters

    @property
    def lock(self) -> threading.Lock:
        return self.table.lock

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

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        next_timer_check = 0.0
        next_idle_check = time.monotonic() + 1.0
        while not stop.is_set() and not self._stop.is_set():
            now = time.monotonic()
            wait = self.config.poll_s
            deadline = self._next_deadline()
            if deadline is not None:  # timers are checked once per tick: a passed deadline waits for the next one
                wait = min(wait, max(0.0, deadline - now, next_timer_check - now))
            readable, _, _ = select.select([self.sock], [], [], wait)
            if readable:
                self._drain()
            now = time.monotonic()
            if now >= next_timer_check:
                # the timer scan runs at most once per tick: the switch's timer resolution
                next_timer_check = now + p.TICK_S
                outbox = Outbox()
                for job in list(self.jobs.values()):
                    if job.next_deadline() is not None:
                        job.expire(now, outbox)
                self._send(outbox)
            if now >= next_idle_check:
                next_idle_check = now + 1.0
                self.table.expire_idle(now)

    def _next_deadline(self) -> float | None:
        deadlines = [d for d in (job.next_deadline() for job in self.jobs.values()) if d is not None]
        return min(deadlines) if deadlines else None

    def _drain(self) -> None:
        """Handle the queued datagrams a batch at a time (bounded, so timers still run under a flood)."""
        if self.fast is not None:
            self.fast.drain()  # the same loop in C
            return
        for _ in range(64):
            try:
                batch = self.receiver.receive()
            except OSError:
                return  # e.g. an ICMP error queued on the socket; nothing to read
            if not len(batch):
                return
            outbox = Outbox()
            self.process(batch, time.monotonic(), outbox)
            self._send(outbox)

    def _send(self, outbox: Outbox) -> None:
        if not len(outbox):
            return
        dropped = self.sender.dropped
        outbox.send(self.sender)
        # a full socket buffer or an unreachable worker: a switch drops, the sender retransmits
        self.counters["tx"] += self.sender.flush()
        self.counters["tx_dropped"] += self.sender.dropped - dropped

    def _send_pointers(self, pointers: np.ndarray, lengths: np.ndarray, dests: np.ndarray) -> None:
        """Send datagrams at memory addresses `pointers` now (the C path's answers)."""
        dropped = self.sender.dropped
        self.sender.add(pointers, lengths, dests)
        self.counters["tx"] += self.sender.flush()
        self.counters["tx_dropped"] += self.sender.dropped - dropped

    # ---- packets ---------------------------------------------------------------------------------------
    def process(self, batch: batch_io.Datagrams, now: float, outbox: Outbox) -> None:
        """Apply one batch of datagrams; what to send goes to `outbox`, in the order a packet-at-a-time switch
        would send it."""
        if self.fast is not None:
            self.fast.process(batch, now, outbox)
            return
        counters = self.counters
        counters["rx"] += len(batch)
        headers, valid = p.parse_headers(batch.buffer, batch.offsets, batch.lengths)
        counters["bad"] += int(np.count_nonzero(~valid))
        control = np.flatnonzero(valid & (headers["type"] != p.DATA))
        start = 0
        for cut in [*control.tolist(), len(batch)]:
            data = start + np.flatnonzero(valid[start:cut] & (headers["type"][start:cut] == p.DATA))
            self._data(headers[data], data, batch, now, outbox)
            if cut < len(batch):
                self._guarded(self._control, headers[cut], cut, batch, now, outbox)
            start = cut + 1

    def _guarded(self, handle: Any, *args: Any) -> None:
        try:
            handle(*args)
        except Exception:  # noqa: BLE001 - one bad datagram must never stop the switch
            self.counters["internal_errors"] += 1
            self.counters["bad"] += 1

    def _data(self, headers: np.ndarray, index: np.ndarray, batch: batch_io.Datagrams, now: float,
              outbox: Outbox) -> None:
        """DATA packets (`index` in the batch), each job's together."""
        if not len(index):
            return
        jobs = headers["job"]
        for job_id in [int(jobs[0])] if (jobs == jobs[0]).all() else np.unique(jobs).tolist():
            if len(jobs) and jobs[0] == job_id and (jobs == job_id).all():
                h, where = headers, index  # one job in the batch: nothing to pick out
            else:
                mine = np.flatnonzero(jobs == job_id)
                h, where = p.take_headers(headers, mine), index[mine]
            job = self.jobs.get(job_id)
            if job is None:
                self.counters["bad"] += len(h)  # an unknown job
                continue
            member = (h["world"] == job.world) & (h["rank"] < job.world)
            if not member.all():
                strangers = int(np.count_nonzero(~member))
                self.counters["bad"] += strangers  # a rank that is not part of the job
                job.counters["bad"] += strangers
                h, where = p.take_headers(h, np.flatnonzero(member)), where[member]
            with self.lock:
                bad = job.counters["bad"]
                try:
                    contribute(job, h, where, batch.buffer, batch.offsets[where], batch.sources[where], now, outbox)
                except Exception:  # noqa: BLE001 - a bug on one batch must never stop the switch
                    self.counters["internal_errors"] += 1
                    job.counters["bad"] += len(h)
                self.counters["bad"] += job.counters["bad"] - bad

    def _control(self, header: np.ndarray | None, index: int, batch: batch_io.Datagrams, now: float,
                 outbox: Outbox) -> None:
        """JOIN, LEAVE, STATS (and packets a worker never sends), one at a time."""
        data = batch.datagram(index)
        key = int(batch.sources[index])
        address = batch_io.key_address(key)
        dest = self._destination(key, address)
        h = p.unpack(data)
        if h.type == p.JOIN:
            outbox.add_bytes(index, self.table.join(h, data, address, key, dest, now), [dest])
            return
        if h.type == p.STATS and h.job == 0:
            totals = {**self.table.totals(), "fast_path": int(self.fast is not None)}
            reply = p.pack(p.STATS_REPLY, 0, 0, 0, 0, p.SWITCH_RANK, 0, 0,
                           values=p.stats_payload(totals, p.SWITCH_COUNTERS))
            outbox.add_bytes(index, reply, [dest])
            return
        job = self.jobs.get(h.job)
        if job is None or h.world != job.world or h.rank >= job.world:
            self.counters["bad"] += 1  # unknown job, or a rank that is not part of it
            if job is not None:
                job.counters["bad"] += 1
            return
        if h.type == p.LEAVE and job.members[h.rank] is None:
            return  # a repeated LEAVE
        if job.members[h.rank] != address:
            job.counters["bad"] += 1
            self.counters["bad"] += 1
            return
        if h.type == p.LEAVE:
            self.table.leave(job, h.rank, address)
            return
        if h.type == p.STATS:  # also the workers' keep-alive: a job between all-reduces is not idle
            job.last_active = now
            reply = p.pack(p.STATS_REPLY, h.job, h.op, 0, 0, p.SWITCH_RANK, job.world, 0,
                           values=p.stats_payload(job.counters))
            outbox.add_bytes(index, reply, [dest])
            return
        self.counters["bad"] += 1  # a worker never sends RESULT, JOINED, STATUS or STATS_REPLY

    def _destination(self, key: int, address: Any) -> int:
        dest = self.sender.address(key)
        self._names[dest] = address
        return dest

    def handle(self, data: bytes, address: Any, now: float) -> list[tuple[bytes, list[Any]]]:
        """Process one datagram from `address` without sending: what the switch would send, as (datagram,
        addresses) (tests drive the state machine packet by packet with chosen times)."""
        return self.handle_batch([(data, address)], now)

    def handle_batch(self, packets: list[tuple[bytes, Any]], now: float, gap: int = 0) -> list[tuple[bytes, list[Any]]]:
        """Process (datagram, address) pairs as one received batch (`gap` bytes between datagrams in the
        buffer), without sending: what the switch would send, as (datagram, addresses)."""
        offsets, end = [], 0
        for data, _ in packets:
            offsets.append(end)
            end += len(data) + gap
        buffer = np.zeros(end + batch_io.PAD, np.uint8)
        for (data, _), offset in zip(packets, offsets, strict=True):
            buffer[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
        keys = [batch_io.address_key(*address) for _, address in packets]
        for key, (_, address) in zip(keys, packets, strict=True):
            self._destination(key, address)
        batch = batch_io.Datagrams(buffer, np.array(offsets, np.int64), np.array([len(d) for d, _ in packets]),
                                   np.array(keys, np.uint64))
        outbox = Outbox()
        self.process(batch, now, outbox)
        return [(datagram, [self._names[d] for d in dests]) for datagram, dests in outbox.datagrams()]

    # ---- reporting -------------------------------------------------------------------------------------
    def job_counters(self) -> dict[int, dict[str, int]]:
        """Counters of every job, live and finished (a copy)."""
        return self.table.job_counters()

    def memory_bytes(self) -> int:
        """Upper bound of the memory the live jobs hold (safe to call from another thread)."""
        return self.table.memory_bytes()
