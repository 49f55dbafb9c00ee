"""A received batch through the C fast path (`innet._fastpath.switch_batch`, csrc/switch_batch.c): the DATA
packets one at a time in arrival order, each as the protocol defines it, on the same job arrays the numpy path
(`aggregate`) works on; both are tested against the per-packet reference and against each other
(tests/innet/test_fastpath.py).

The C loop stops at a control packet (JOIN, LEAVE, STATS: the switch's Python handler answers it) and when its
outbox cannot hold one more packet's answers. What the batch sends goes out at each stop, so answers leave in
packet order: sent on the switch's socket, or copied into an `Outbox` (`Switch.process`, for callers that
collect a batch's answers without sending them).
"""

from __future__ import annotations

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
STOP_END, STOP_CONTROL, STOP_FULL = 0, 1, 2


class FastBatches:
    """The C path of one switch: its outbox (entries: packet index, address, length, destination) and the loop."""

    def __init__(self, native: ModuleType, switch: Switch) -> None:
        self.native, self.switch = native, switch
        self.entries = np.zeros((4, ENTRIES), np.int64)  # rows: order, pointer, length, destination
        self.scratch = np.zeros(SCRATCH_BYTES, np.uint8)
        self.fill = np.zeros(3, np.int64)  # entries used, scratch bytes used, generation (changes at each send)

    def process(self, batch: batch_io.Datagrams, now: float, collect: Outbox | None = None) -> None:
        """Apply the batch; its answers are sent (or, with `collect`, copied into it) in packet order."""
        switch = self.switch
        switch.counters["rx"] += len(batch)
        start = 0
        while start < len(batch):
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
            if stop == STOP_CONTROL:
                outbox = collect if collect is not None else Outbox()
                switch._guarded(switch._control, None, start, batch, now, outbox)
                if collect is None:
                    switch._send(outbox)
                start += 1

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
