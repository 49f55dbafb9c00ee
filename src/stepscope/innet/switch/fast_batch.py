"""The switch's batches through the C fast path (csrc/switch_batch.c): the DATA packets one at a time in arrival
order, each as the protocol defines it, on the same job arrays the numpy path (`aggregate`) works on; both are
tested against the per-packet reference and against each other (tests/innet/test_fastpath.py).

`drain` is the switch's receive loop in one C call (csrc/switch_drain.c: receive, apply, send, until the socket is
empty); `process` applies one batch already received. The C loop stops at a control packet (JOIN, LEAVE, STATS:
the switch's Python handler answers it, then the rest of the batch goes on) and when its outbox cannot hold one
more packet's answers. What a batch sends goes out at each stop, so answers leave in packet order: sent on the
switch's socket, or copied into an `Outbox` (`Switch.process`, for callers that collect a batch's answers).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from stepscope.innet.switch.outbox import Outbox
from stepscope.innet.wire import batch_io

if TYPE_CHECKING:
    from stepscope.innet.switch.server import Switch

ENTRIES = 16_384
"""Answers the outbox holds between sends (a completion is one per member: at most 1024)."""
SCRATCH_BYTES = 8 << 20
"""Bytes of answers built by the C loop between sends (re-served results, STATUS, OLD; at most 2 x 64 KiB each)."""
ROUNDS = 64
"""Batches one drain receives at most (then timers run: a flood must not starve them)."""
STOP_END, STOP_CONTROL, STOP_FULL = 0, 1, 2


class FastBatches:
    """The C path of one switch: its outbox (entries: packet index, address, length, destination) and the loop."""

    def __init__(self, native: ModuleType, switch: Switch) -> None:
        self.native, self.switch = native, switch
        self.entries = np.zeros((4, ENTRIES), np.int64)  # rows: order, pointer, length, destination
        self.scratch = np.zeros(SCRATCH_BYTES, np.uint8)
        self.fill = np.zeros(3, np.int64)  # entries used, scratch bytes used, generation (changes at each send)

    def drain(self) -> None:
        """Receive, apply and send until the switch's socket is empty (at most ROUNDS batches)."""
        switch, receiver, sender = self.switch, self.switch.receiver, self.switch.sender
        counters = switch.counters
        try:
            stop, count, start, received, bad, sent, dropped, gso, _error = self.native.switch_drain(
                receiver.sock.fileno(), switch.jobs, receiver.buffer, receiver.messages, receiver.message_bytes,
                receiver.gro, receiver._offsets, receiver._lengths, receiver._sources, self.entries, self.scratch,
                self.fill, sender._names, sender.gso, ROUNDS)
        except Exception:  # noqa: BLE001 - a bug on one batch must never stop the switch
            counters["internal_errors"] += 1
            counters["bad"] += 1
            self.fill[:2] = 0
            self.fill[2] += 1
            return
        # a receive error (an ICMP error queued on the socket) ends the drain, as on the numpy path
        counters["rx"] += received
        counters["bad"] += bad
        counters["tx"] += sent
        counters["tx_dropped"] += dropped
        sender.gso, sender.sent, sender.dropped = bool(gso), sender.sent + sent, sender.dropped + dropped
        if stop == STOP_CONTROL:  # the batch is in the receiver's arrays: its control packet, then the rest
            batch = batch_io.Datagrams(receiver.buffer, receiver._offsets[:count], receiver._lengths[:count],
                                       receiver._sources[:count])
            self.process(batch, time.monotonic(), control_at=start)

    def process(self, batch: batch_io.Datagrams, now: float, collect: Outbox | None = None,
                control_at: int | None = None) -> None:
        """Apply the batch; its answers are sent (or, with `collect`, copied into it) in packet order.
        `control_at`: go on from this control packet (`drain` stopped there, having counted the batch)."""
        switch = self.switch
        start, stop = (control_at, STOP_CONTROL) if control_at is not None else (0, STOP_END)
        if control_at is None:
            switch.counters["rx"] += len(batch)
        while start < len(batch):
            if stop == STOP_CONTROL:
                outbox = collect if collect is not None else Outbox()
                switch._guarded(switch._control, None, start, batch, now, outbox)
                if collect is None:
                    switch._send(outbox)
                start += 1
                stop = STOP_END
                continue
            try:
                start, stop, bad = self.native.switch_batch(switch.jobs, batch.buffer, batch.offsets, batch.lengths,
                                                            batch.sources, start, now, self.entries, self.scratch,
                                                            self.fill)
            except Exception:  # noqa: BLE001 - a bug on one batch must never stop the switch
                switch.counters["internal_errors"] += 1
                switch.counters["bad"] += len(batch) - start
                stop, start = STOP_END, len(batch)
                bad = 0
            switch.counters["bad"] += bad
            self._flush(collect)

    def _flush(self, collect: Outbox | None) -> None:
        count = int(self.fill[0])
        if count:
            order, pointer, length, dest = self.entries[:, :count]
            if collect is None:
                self.switch._send_pointers(pointer, length, dest)
            else:  # the rows may take new blocks before the collector sends: copies (of the entries too)
                collect.add_copies(order.copy(), pointer, length.copy(), dest.copy())
        self.fill[0] = self.fill[1] = 0
        self.fill[2] += 1
