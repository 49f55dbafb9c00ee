"""The worker's protocol engine: one UDP socket and one I/O thread that send the stream's ready packets
within a window, retransmit each on its own timer with exponential backoff, and hand results to the
`Stream` (which decides what each slot sends next).

Never a hang: the socket is connected to the switch (a refused port raises at once), every wait has a
timeout, and an op that makes no progress for `timeout_s` fails with a diagnosis instead of waiting.
"""

from __future__ import annotations

import heapq
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass, field

from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.faults import FaultConfig, FaultInjector
from stepscope.innet.worker.op import Op
from stepscope.innet.worker.rto import RetransmitTimeout
from stepscope.innet.worker.stream import InnetError, Stream, WorkerCounters

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


@dataclass
class _Outstanding:
    op: Op
    q: int
    packet: bytes | None  # None until a sender thread built it
    sent_at: float
    sends: int = 1


class Engine:
    """Owns the socket after JOIN; `submit` hands ops to the I/O thread."""

    def __init__(self, sock: socket.socket, settings: EngineSettings) -> None:
        self.sock, self.cfg = sock, settings
        self.s = settings.slots
        self.counters = WorkerCounters()
        self.rto = RetransmitTimeout(settings.rto_s, settings.rto_min_s, settings.rto_max_s, settings.backoff)
        self.faults = FaultInjector(settings.faults, settings.rank, self._raw_send, self._on_datagram)
        self.faulty = settings.faults.network  # without injected faults the socket is used directly
        self._fault_lock = threading.Lock()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.stream = Stream(settings.slots, settings.rank, settings.stash_limit_bytes, self.counters)
        self.outstanding: dict[int, _Outstanding] = {}
        self.timers: list[tuple[float, int, int]] = []  # (deadline, stream index, sends)
        self.stats_reply: tuple[int, dict[str, int]] | None = None  # (request number, counters)
        self.stats_event = threading.Event()
        self._stats_request = 0  # id of the newest counters request (the op field; keep-alives send 0)
        self.waiting_for: list[int] = []
        self.last_heard = self.last_progress = self.last_sent = time.monotonic()
        self.fatal: InnetError | None = None
        self._closing = False
        self._senders: list[threading.Thread] = []
        self._send_queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(settings.sender_threads):
            thread = threading.Thread(target=self._sender_loop, name=f"innet-send{i}", daemon=True)
            thread.start()
            self._senders.append(thread)
        self.thread = threading.Thread(target=self._run, name=f"innet-io-r{settings.rank}", daemon=True)
        self.thread.start()

    # ---- caller side ------------------------------------------------------------------------------
    def submit(self, op: Op) -> None:
        if self.fatal is not None:
            raise InnetError(str(self.fatal))
        self.inbox.put(("op", op))
        self._wake()
        if self.fatal is not None:  # the I/O thread stopped meanwhile and may have drained the inbox already
            op.finish(InnetError(str(self.fatal)))

    def request_stats(self, timeout_s: float = 2.0) -> dict[str, int]:
        # a numbered request: the reply to a keep-alive sent just before must not pass for this one's
        self._stats_request = request = self._stats_request % 0xFFFFFFFF + 1
        self.stats_event.clear()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.inbox.put(("stats", request))
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
                readable, _, _ = select.select([self.sock, self._wake_r], [], [], self._wait_time())
                if self._wake_r in readable:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                if self.sock in readable:
                    self._drain()
                now = time.monotonic()
                with self._fault_lock:
                    self.faults.flush(now)
                self._retransmit(now)
                self._watchdog(now)
                if now - self.last_sent > KEEPALIVE_S:
                    self._raw_send(p.pack(p.STATS, self.cfg.job_id, 0, 0, 0, self.cfg.rank, self.cfg.world, 0))
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
        timers = self.timers
        while timers and self._stale(timers[0]):
            heapq.heappop(timers)  # answered packets: no wake-up for them
        if timers:
            wait = min(wait, max(0.0, self.timers[0][0] - now))
        release = self.faults.next_release()
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
                self._raw_send(p.pack(p.STATS, self.cfg.job_id, item, 0, 0, self.cfg.rank, self.cfg.world, 0))
                continue
            self.stream.admit(item)
            self.last_progress = time.monotonic()

    def _pump(self) -> None:
        """Send ready packets while the window has room."""
        while len(self.outstanding) < self.cfg.window:
            item = self.stream.pop_ready(self.outstanding)
            if item is None:
                return
            index, op, q = item
            slot, version = index % self.s, (index // self.s) % 2
            now = time.monotonic()
            entry = _Outstanding(op, q, None, now)
            self.outstanding[index] = entry
            heapq.heappush(self.timers, (now + self.rto.for_send(1), index, 1))
            self.counters.sent += 1
            if self._senders:
                self._send_queue.put((entry, slot, version))
            else:
                entry.packet = op.build(q, self.cfg.job_id, self.cfg.rank, slot, version)
                self._send(entry.packet)

    def _sender_loop(self) -> None:
        while True:
            item = self._send_queue.get()
            if item is None:
                return
            entry, slot, version = item
            try:
                entry.packet = entry.op.build(entry.q, self.cfg.job_id, self.cfg.rank, slot, version)
                self._send(entry.packet)
            except Exception as error:  # noqa: BLE001 - reported through the op
                entry.op.finish(InnetError(f"building a packet failed: {error!r}"))

    def _send(self, packet: bytes) -> None:
        if not self.faulty:
            self._raw_send(packet)
            return
        with self._fault_lock:
            self.faults.send(packet)

    def _raw_send(self, packet: bytes) -> None:
        self.last_sent = time.monotonic()
        try:
            self.sock.send(packet)
        except BlockingIOError:
            pass  # the socket buffer is full: the packet is lost, the retransmission timer recovers it
        except ConnectionRefusedError:
            raise self._refused() from None

    def _refused(self) -> InnetError:
        return InnetError(self._unreachable("refused the packets (nothing listens on that port)"))

    def _drain(self) -> None:
        for _ in range(1024):
            try:
                data = self.sock.recv(65_536)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                raise self._refused() from None
            self.last_heard = time.monotonic()
            if not self.faulty:
                self._on_datagram(data)
                continue
            with self._fault_lock:
                self.faults.receive(data)

    # ---- packets from the switch ----------------------------------------------------------------------
    def _on_datagram(self, data: bytes) -> None:
        try:
            h = p.unpack(data)
        except p.ProtocolError:
            return
        if h.job != self.cfg.job_id:
            return
        if h.type == p.RESULT:
            self._on_result(h, data)
        elif h.type == p.STATUS:
            self.counters.status_replies += 1
            self.waiting_for = [r for r in range(self.cfg.world)
                                if r not in p.ranks_in_bitmap(p.values_of(data, h.count), self.cfg.world)]
        elif h.type == p.STATS_REPLY and h.op and h.op == self._stats_request:  # not a keep-alive's reply
            self.stats_reply = (h.op, p.stats_from_payload(data, h.count))
            self.stats_event.set()

    def _on_result(self, h: p.Header, data: bytes) -> None:
        index = self.stream.apply(h, data)
        if index is None:
            return
        self.last_progress = time.monotonic()
        entry = self.outstanding.pop(index, None)
        if entry is not None and entry.sends == 1:
            self.rto.sample(self.last_progress - entry.sent_at)  # Karn: first transmissions only

    # ---- timers ------------------------------------------------------------------------------------
    def _retransmit(self, now: float) -> None:
        timers = self.timers
        while timers and timers[0][0] <= now:
            _, index, sends = heapq.heappop(timers)
            entry = self.outstanding.get(index)
            if entry is None or entry.sends != sends:
                continue  # answered, or already rescheduled
            if entry.packet is None:  # a sender thread has not built it yet
                heapq.heappush(timers, (now + self.rto.for_send(sends), index, sends))
                continue
            entry.sends += 1
            self.counters.retransmitted += 1
            heapq.heappush(timers, (now + self.rto.for_send(entry.sends), index, entry.sends))
            self._send(p.with_flags(entry.packet, p.RETRANSMIT))

    def _stale(self, timer: tuple[float, int, int]) -> bool:
        entry = self.outstanding.get(timer[1])
        return entry is None or entry.sends != timer[2]

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
