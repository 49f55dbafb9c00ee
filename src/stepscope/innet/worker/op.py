"""One all-reduce on a worker: how its tensor maps to blocks and packets, and where results go.

An op of n values is C = ceil(n / k) data blocks. A float op (quantized) starts with P = min(slots, C)
exponent-only prologue packets, so the op is T = P + C packets in the job's stream: packet q < P is the
prologue of block q, packet P + c carries the values of block c. Every packet q also carries this
worker's exponent of data block q (the block that waits on it), which is how the exponent is agreed one
block ahead. An int32 op has no prologue (P = 0) and is summed exactly (an average divides by the count, toward zero).

Results are written into the op's own tensor (in place): a block's values are read, quantized and kept
in the stored datagram before its result can arrive, so the overwrite is safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope.innet.wire import protocol as p
from stepscope.innet.wire.quantize import block_exponents, dequantize, quantize


class Op:
    """A submitted all-reduce: its blocks, agreed exponents, results and completion."""

    def __init__(self, op_id: int, array: np.ndarray, *, average: bool, min_count: int, preemptive: bool,
                 values_per_packet: int, slots: int, world: int) -> None:
        self.op_id, self.array, self.average = op_id, array, average
        self.quantized = array.dtype == np.float32
        self.min_count, self.preemptive, self.world = min_count, preemptive, world
        self.k = values_per_packet
        self.n = len(array)
        self.blocks = -(-self.n // self.k)
        self.prologue = min(slots, self.blocks) if self.quantized else 0
        self.packets = self.prologue + self.blocks
        self.own_exponent = block_exponents(array, self.k) if self.quantized else None
        self.agreed = np.full(self.blocks, p.NO_EXPONENT, dtype=np.int16)
        self.done = bytearray(self.packets)
        self.remaining = self.packets
        self.contributors = np.zeros(self.blocks, dtype=np.int32)
        self.timed_out_blocks = 0
        self.clipped: set[int] = set()
        """Data blocks this rank sent clipped: its exponent was larger than the one agreed without it (a rank
        that caught up after the block's prologue completed by timeout or fastest-K)."""
        self.op_flags = ((p.AVERAGE if average else 0) | (p.QUANTIZED if self.quantized else 0)
                         | (p.PREEMPTIVE if preemptive else 0))
        self.base = -1  # stream index of packet 0, set when the engine admits the op
        self.submitted = time.perf_counter()
        self.finished: float | None = None
        self.error: BaseException | None = None
        self.event = threading.Event()
        self.callbacks: list[Callable[[Op], Any]] = []
        self._finish_lock = threading.Lock()  # the I/O thread, a sender thread or the caller may finish it

    # ---- mapping ---------------------------------------------------------------------------------
    def is_prologue(self, q: int) -> bool:
        return q < self.prologue

    def block_of(self, q: int) -> int:
        return q if q < self.prologue else q - self.prologue

    def packet_of(self, prologue: bool, offset: int) -> int | None:
        """Packet index of a block given its header fields, or None when they do not fit this op."""
        block, rest = divmod(offset, self.k)
        if rest or block >= self.blocks or (prologue and block >= self.prologue):
            return None
        if prologue and not self.quantized:
            return None
        return block if prologue else self.prologue + block

    def can_send(self, q: int) -> bool:
        """A data block needs its agreed exponent (from the result of packet `block`)."""
        return not self.quantized or q < self.prologue or self.agreed[q - self.prologue] != p.NO_EXPONENT

    # ---- packets ---------------------------------------------------------------------------------
    def build(self, q: int, job: int, rank: int, slot: int, version: int) -> bytes:
        next_exponent = int(self.own_exponent[q]) if self.quantized and q < self.blocks else p.NO_EXPONENT
        if self.is_prologue(q):
            return p.pack(p.DATA, job, self.op_id, q * self.k, slot, rank, self.world, version | p.PROLOGUE,
                          contributors=self.min_count, next_exponent=next_exponent, op_flags=self.op_flags)
        block = q - self.prologue
        start = block * self.k
        values = self.array[start:start + self.k]
        if self.quantized:
            exponent = int(self.agreed[block])
            if self.own_exponent[block] > exponent:  # its largest value does not fit the agreed range
                self.clipped.add(block)
            ints = quantize(values, exponent, self.world)
        else:
            exponent, ints = 0, values
        return p.pack(p.DATA, job, self.op_id, start, slot, rank, self.world, version,
                      contributors=self.min_count, exponent=exponent, next_exponent=next_exponent,
                      op_flags=self.op_flags, values=ints)

    def apply_result(self, q: int, h: p.Header, data: bytes) -> None:
        """Take a block's result: the agreed exponent it brings and, for data blocks, the values."""
        if q < self.blocks and self.quantized:
            self.agreed[q] = h.next_exponent
        if h.flags & (p.TIMEOUT | p.K_REACHED):
            self.timed_out_blocks += 1
        if not self.is_prologue(q):
            block = q - self.prologue
            start = block * self.k
            ints = p.values_of(data, h.count)
            if self.quantized:
                divisor = h.contributors if self.average else 1
                self.array[start:start + h.count] = dequantize(ints, h.exponent, self.world, divisor)
            elif self.average:  # exact sum, then C's integer division (toward zero) by the real count
                total = ints.astype(np.int64)
                self.array[start:start + h.count] = np.sign(total) * (np.abs(total) // h.contributors)
            else:
                self.array[start:start + h.count] = ints
            self.contributors[block] = h.contributors
        self.done[q] = 1
        self.remaining -= 1

    def result_fits(self, q: int, h: p.Header) -> bool:
        """A result's value count must be this block's size (prologue: none)."""
        if self.is_prologue(q):
            return h.count == 0
        block = q - self.prologue
        return h.count == min(self.k, self.n - block * self.k)

    # ---- completion ------------------------------------------------------------------------------
    def finish(self, error: BaseException | None = None) -> None:
        """Complete the op (once: later calls are ignored) and run its callbacks."""
        with self._finish_lock:
            if self.event.is_set():
                return
            self.error = error
            self.finished = time.perf_counter()
            self.event.set()
        for callback in self.callbacks:
            callback(self)

    def summary(self) -> dict[str, Any]:
        """What happened to this op: blocks, timed-out blocks, contributor counts, seconds."""
        contributors = self.contributors[:self.blocks]
        return {"op": self.op_id, "values": self.n, "blocks": self.blocks, "packets": self.packets,
                "timed_out_blocks": self.timed_out_blocks, "clipped_blocks": len(self.clipped),
                "min_contributors": int(contributors.min()) if self.blocks else self.world,
                "seconds": (self.finished or time.perf_counter()) - self.submitted}
