"""The worker's protocol engine: the sockets to the switch (one per switch shard; slot j talks to shard j mod
shards) and one I/O thread that sends the stream's ready packets within a window, retransmits each on its own
timer with exponential backoff, and hands results to the `Stream` (which decides what each slot sends next).

A batch at a time (`wire.batch_io`): every ready packet is built straight into its slot's row of the send window
and all go out in one `sendmmsg` (equal-size runs as one GSO message); every queued result is read by one
`recvmmsg` into a preallocated buffer, parsed as one header array and applied per op. With `sender_threads`,
threads build (quantize) and send the packets while the I/O thread receives: numpy and the system calls release
the interpreter lock, so they overlap on several cores.

Never a hang: each socket is connected to its shard (a refused port raises at once), every wait has a timeout,
and an op that makes no progress for `timeout_s` fails with a diagnosis instead of waiting.
"""

from __future__ import annotations

import queue
import select
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from stepscope.innet.wire import batch_io, fastpath
from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.faults import FaultConfig
from stepscope.innet.worker.links import Links, as_batch
from stepscope.innet.worker.op import Op
from stepscope.innet.worker.rto import RetransmitTimeout
from stepscope.innet.worker.stream import InnetError, Stream, WorkerCounters
from stepscope.innet.worker.window import SendWindow

RECV_BUFFER_BYTES = 4 << 20
KEEPALIVE_S = 1.0
"""A worker silent this long sends a counters request (its reply is ignored), so the switch neither forgets
a job that pauses between all-reduces (evaluation, checkpointing; idle_s 300 s by default) nor evicts one
that has joined but not completed a block yet for a new job when its table is full (evict_after_s 5 s)."""


@dataclass
class EngineSettings:
    """What the engine needs from the job configuration (resolved numbers)."""

    job_id: int
    rank: int
    world: int
    values_per_packet: int
    slots: int
    window: int
    rto_s: float | None
    """Fixed first retransmission timeout, or None for adaptive."""
    rto_min_s: float
    rto_max_s: float
    backoff: float
    timeout_s: float
    sender_threads: int
    stash_limit_bytes: int
    faults: FaultConfig = field(default_factory=FaultConfig)
    offload: bool = True
    """UDP segmentation offload (GSO out, GRO in) where the kernel has it."""


class Engine:
    """Owns the sockets after JOIN; `submit` hands ops to the I/O thread."""

    def __init__(self, socks: list[socket.socket], settings: EngineSettings) -> None:
        self.socks, self.cfg = socks, settings
        self.s = settings.slots
        self.counters = WorkerCounters()
        self.rto = RetransmitTimeout(settings.rto_s, settings.rto_min_s, settings.rto_max_s, settings.backoff)
        self.window = SendWindow(settings.slots, settings.values_per_packet, self.rto)
        self.links = Links(socks, settings.rank, settings.faults, settings.offload, self._refused)
        self.faults = self.links.faults
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.stream = Stream(settings.slots, settings.rank, settings.stash_limit_bytes, self.counters,
                             fastpath.resolve())
        self.stats_reply: tuple[int, dict[str, int]] | None = None  # (request number, counters)
        self.stats_event = threading.Event()
        self._stats_request = 0  # id of the newest counters request (the op field; keep-alives send 0)
        self.waiting_for: list[int] = []
        self.last_heard = self.last_progress = time.monotonic()
        self.fatal: InnetError | None = None
        self._closing = False
        self._send_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._senders = [threading.Thread(target=self._sender_loop, name=f"innet-send{i}", daemon=True)
                         for i in range(settings.sender_threads)]
        for thread in self._senders:
            thread.start()
        self.thread = threading.Thread(target=self._run, name=f"innet-io-r{settings.rank}", daemon=True)
        self.thread.start()

    @property
    def sock(self) -> socket.socket:
        """The socket to the first shard (control messages: counters, keep-alives, LEAVE)."""
        return self.socks[0]

    # ---- caller side ------------------------------------------------------------------------------
    def submit(self, op: Op) -> None:
        if self.fatal is not None:
            raise InnetError(str(self.fatal))
        self.inbox.put(("op", op))
        self._wake()
        if self.fatal is not None:  # the I/O thread stopped meanwhile and may have drained the inbox already
            op.finish(InnetError(str(self.fatal)))

    def request_stats(self, timeout_s: float = 2.0) -> dict[str, int]:
        """The job's counters at the switch (summed over its shards)."""
        total: dict[str, int] = {}
        for link in range(len(self.socks)):
            for name, value in self._stats_of(link, timeout_s).items():
                total[name] = total.get(name, 0) + value
        return total

    def _stats_of(self, link: int, timeout_s: float) -> dict[str, int]:
        # a numbered request: the reply to a keep-alive sent just before must not pass for this one's
        self._stats_request = request = self._stats_request % 0xFFFFFFFF + 1
        self.stats_event.clear()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.inbox.put(("stats", (request, link)))
            self._wake()
            if self.stats_event.wait(0.1):
                answered, stats = self.stats_reply or (0, {})
                if answered == request:  # a late reply to an earlier request may have set the event
                    return dict(stats)
                self.stats_event.clear()
        raise InnetError(f"the switch did not answer a counters request within {timeout_s:g} s")

    def close(self) -> None:
        self._closing = True
        self._wake()
        self.thread.join(5.0)
        for _ in self._senders:
            self._send_queue.put(None)
        for thread in self._senders:
            thread.join(2.0)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or we are closing)

    # ---- the I/O thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                self._admit()
                self._pump()
                readable, _, _ = select.select([*self.socks, self._wake_r], [], [], self._wait_time())
                if self._wake_r in readable:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                for link, sock in enumerate(self.socks):
                    if sock in readable:
                        for batch in self.links.receive(link):
                            self.last_heard = time.monotonic()
                            self._on_batch(batch)
                now = time.monotonic()
                if self.links.faulty:
                    for batch in self.links.released(now):
                        self._on_batch(batch)
                self._retransmit(now)
                self._watchdog(now)
                if now - self.links.last_sent > KEEPALIVE_S:
                    self.links.control(p.pack(p.STATS, self.cfg.job_id, 0, 0, 0, self.cfg.rank, self.cfg.world, 0))
        except BaseException as error:  # noqa: BLE001 - every failure must reach the waiting callers
            self.fatal = error if isinstance(error, InnetError) else InnetError(f"innet worker failed: {error!r}")
        else:  # closed: an op still in flight can never finish, so its waiter must not sit out its timeout
            self.fatal = InnetError("the innet job was closed before this all-reduce finished")
        self._fail_pending(self.fatal)

    def _fail_pending(self, error: InnetError) -> None:
        """Finish every admitted or queued op with `error` (the engine stops serving them)."""
        for op in list(self.stream.ops.values()):
            op.finish(error)
        while True:
            try:
                kind, item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "op":
                item.finish(error)

    def _wait_time(self) -> float:
        now = time.monotonic()
        wait = 0.05
        deadline = self.window.next_deadline()
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - now))
        release = self.links.next_release()
        if release is not None:
            wait = min(wait, max(0.0, release - now))
        return wait

    def _admit(self) -> None:
        while True:
            try:
                kind, item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "stats":
                request, link = item
                self.links.control(p.pack(p.STATS, self.cfg.job_id, request, 0, 0, self.cfg.rank, self.cfg.world,
                                          0), link)
                continue
            self.stream.admit(item, self._apply_stashed)
            self.last_progress = time.monotonic()

    def _pump(self) -> None:
        """Build and send the ready packets while the window has room."""
        room = self.cfg.window - self.window.in_flight
        if room <= 0:
            return
        now = time.monotonic()
        for op, q, slots in self.stream.ready(self.window.idle(), room):
            self.window.occupy(slots, op.base + q, now)
            self.counters.sent += len(q)
            if self._senders:  # the sender threads build and send it in parts, in parallel
                for part in np.array_split(np.arange(len(q)), len(self._senders)):
                    if len(part):
                        self._send_queue.put((op, q[part], slots[part]))
            else:
                self._build_and_send(op, q, slots)

    def _build_and_send(self, op: Op, q: np.ndarray, slots: np.ndarray, senders: list | None = None) -> None:
        window = self.window
        lengths = op.build_into(q, window.rows, slots, (op.base + q) // self.s % 2, self.cfg.job_id, self.cfg.rank)
        window.mark_built(slots, lengths)
        self.links.send_rows(window, slots, senders)

    def _sender_loop(self) -> None:
        senders = self.links.senders_for_thread()
        while True:
            item = self._send_queue.get()
            if item is None:
                return
            op, q, slots = item
            try:
                self._build_and_send(op, q, slots, senders)
            except Exception as error:  # noqa: BLE001 - reported through the op
                op.finish(InnetError(f"building a packet failed: {error!r}"))

    def _refused(self) -> InnetError:
        return InnetError(self._unreachable("refused the packets (nothing listens on that port)"))

    # ---- packets from the switch ----------------------------------------------------------------------
    def _on_batch(self, batch: batch_io.Datagrams) -> None:
        indices = self.stream.apply_batch(batch, self.cfg.job_id)  # the usual batch, in C; else as below
        if indices is not None:
            if len(indices):
                self.last_progress = time.monotonic()
                self.window.answer(indices, self.last_progress)
            return
        headers, valid = p.parse_headers(batch.buffer, batch.offsets, batch.lengths)
        mine = valid & (headers["job"] == self.cfg.job_id)
        kinds = headers["type"]
        results = np.flatnonzero(mine & (kinds == p.RESULT))
        if len(results):
            self._on_results(p.take_headers(headers, results), batch, results)
        for i in np.flatnonzero(mine & (kinds != p.RESULT)).tolist():
            self._on_control(batch.datagram(i))

    def _on_results(self, h: np.ndarray, batch: batch_io.Datagrams, where: np.ndarray) -> None:
        indices = self.stream.apply(h, batch.buffer, batch.offsets[where], lambda i: batch.datagram(int(where[i])))
        if len(indices):
            self.last_progress = time.monotonic()
            self.window.answer(indices, self.last_progress)

    def _apply_stashed(self, datagrams: list[bytes]) -> None:
        self._on_batch(as_batch(datagrams))

    def _on_control(self, data: bytes) -> None:
        h = p.unpack(data)
        if h.type == p.STATUS:
            self.counters.status_replies += 1
            self.waiting_for = [r for r in range(self.cfg.world)
                                if r not in p.ranks_in_bitmap(p.values_of(data, h.count), self.cfg.world)]
        elif h.type == p.STATS_REPLY and h.op and h.op == self._stats_request:  # not a keep-alive's reply
            self.stats_reply = (h.op, p.stats_from_payload(data, h.count))
            self.stats_event.set()

    # ---- timers ------------------------------------------------------------------------------------
    def _retransmit(self, now: float) -> None:
        slots = self.window.due(now)
        if len(slots):
            self.counters.retransmitted += len(slots)
            self.links.send_rows(self.window, slots)

    def _watchdog(self, now: float) -> None:
        if not self.stream.ops or now - self.last_progress <= self.cfg.timeout_s:
            return
        if now - self.last_heard > self.cfg.timeout_s:
            raise InnetError(self._unreachable(f"did not answer for {self.cfg.timeout_s:g} s"))
        waiting = f"; the switch is waiting for rank(s) {self.waiting_for}" if self.waiting_for else ""
        raise InnetError(f"no all-reduce progress for {self.cfg.timeout_s:g} s on rank {self.cfg.rank}{waiting} "
                         f"(a peer stopped or straggles longer than the timeout)")

    def _unreachable(self, what: str) -> str:
        host, port = self.sock.getpeername() if self._connected() else ("?", "?")
        return (f"innet switch at {host}:{port} {what}; is `stepscope innet switch --port {port}` running?")

    def _connected(self) -> bool:
        try:
            self.sock.getpeername()
            return True
        except OSError:
            return False
