"""The worker's sockets to the switch, one per shard (slot j's packets go to shard j mod shards), used a batch at
a time (`wire.batch_io`), and the fault injector around them: with injected faults every datagram passes
through it one by one as bytes (a slow path for tests and fault studies), without them the window's rows go
straight to `sendmmsg` and received batches straight to the engine.

    links = Links(socks, offload=True, faults=FaultInjector(...) or None)
    links.send_rows(window, slots)             # the datagrams in those window rows, each to its slot's shard
    for batch in links.receive(shard): ...     # what is queued there (after the injector, if any)
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from stepscope.innet.wire import batch_io
from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.faults import FaultConfig, FaultInjector
from stepscope.innet.worker.window import SendWindow


class Links:
    """Batched senders and receivers on the sockets to every shard, and the fault injector around them."""

    def __init__(self, socks: list[socket.socket], rank: int, faults: FaultConfig, offload: bool,
                 refused: Callable[[], Exception]) -> None:
        self.socks = socks
        self.receivers = [batch_io.Receiver(sock, gro=offload) for sock in socks]
        self.senders = [batch_io.Sender(sock, gso=offload) for sock in socks]
        self.offload, self.refused = offload, refused
        self.faulty = faults.network  # without injected faults the sockets are used directly
        self._up: list[bytes] = []  # what the fault injector lets through, per direction
        self._down: list[bytes] = []
        self.faults = FaultInjector(faults, rank, self._up.append, self._down.append)
        self._fault_lock = threading.Lock()
        self.last_sent = time.monotonic()

    def senders_for_thread(self) -> list[batch_io.Sender]:
        """Senders of the caller's own (a sender thread must not share the I/O thread's queues)."""
        return [batch_io.Sender(sock, gso=self.offload) for sock in self.socks]

    def send_rows(self, window: SendWindow, slots: np.ndarray, senders: list | None = None) -> None:
        """Send the datagrams in the window rows of `slots`, each on its slot's shard."""
        pointers, lengths = window.pointers(slots)
        senders = senders or self.senders
        if self.faulty:
            with self._fault_lock:
                for length, slot in zip(lengths.tolist(), slots.tolist(), strict=True):
                    self._up.clear()
                    self.faults.send(bytes(window.rows[slot, :length]))
                    self.send_bytes(self._up, senders)
                self._up.clear()
            return
        shards = len(senders)
        for link, sender in enumerate(senders):
            mine = slice(None) if shards == 1 else (slots % shards == link)
            sender.add(pointers[mine], lengths[mine])
            self._flush(sender)

    def _flush(self, sender: batch_io.Sender) -> None:
        self.last_sent = time.monotonic()
        try:
            sender.flush()  # a full socket buffer loses packets: the retransmission timers recover them
        except ConnectionRefusedError:
            raise self.refused() from None

    def send_bytes(self, datagrams: list[bytes], senders: list | None = None) -> None:
        """Datagrams held as bytes (through the fault injector): a DATA packet to its slot's shard."""
        senders = senders or self.senders
        for data in datagrams:
            shard = int.from_bytes(data[16:18], "little") % len(senders) if data[3] == p.DATA else 0
            senders[shard].add_bytes(data)
        for sender in senders:
            if len(sender):
                self._flush(sender)

    def control(self, datagram: bytes, link: int = 0) -> None:
        """A control message (counters request, keep-alive) to shard `link`, around the fault injector."""
        self.senders[link].add_bytes(datagram)
        self._flush(self.senders[link])

    def receive(self, link: int) -> Iterator[batch_io.Datagrams]:
        """The batches queued on shard `link`'s socket (bounded, so timers still run), after the injector."""
        for _ in range(64):
            try:
                batch = self.receivers[link].receive()
            except ConnectionRefusedError:
                raise self.refused() from None
            if not len(batch):
                return
            if not self.faulty:
                yield batch
                continue
            with self._fault_lock:
                for i in range(len(batch)):
                    self.faults.receive(batch.datagram(i))
            yield from self.released()

    def released(self, now: float | None = None) -> Iterator[batch_io.Datagrams]:
        """Hand on what the fault injector let through (held datagrams come out later; `now`: release those
        held too long)."""
        if now is not None:
            with self._fault_lock:
                self.faults.flush(now)
        if self._up:
            up, self._up[:] = list(self._up), []
            self.send_bytes(up)
        if self._down:
            down, self._down[:] = list(self._down), []
            yield as_batch(down)

    def next_release(self) -> float | None:
        return self.faults.next_release() if self.faulty else None


def as_batch(datagrams: list[bytes]) -> batch_io.Datagrams:
    """Datagrams held as bytes (through the fault injector, or stashed) as one batch."""
    lengths = np.array([len(d) for d in datagrams], np.int64)
    offsets = np.cumsum(lengths) - lengths
    buffer = np.zeros(int(lengths.sum()) + batch_io.PAD, np.uint8)
    buffer[:int(lengths.sum())] = np.frombuffer(b"".join(datagrams), np.uint8)
    return batch_io.Datagrams(buffer, offsets, lengths)
