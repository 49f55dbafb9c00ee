"""One all-reduce on a worker: how its tensor maps to blocks and packets, and where results go.

An op of n values is C = ceil(n / k) data blocks. A float op (quantized) starts with P = min(slots, C)
exponent-only prologue packets, so the op is T = P + C packets in the job's stream: packet q < P is the
prologue of block q, packet P + c carries the values of block c. Every packet q also carries this
worker's exponent of data block q (the block that waits on it), which is how the exponent is agreed one
block ahead. An int32 op has no prologue (P = 0) and is summed exactly (an average divides by the count, toward zero).

Packets are built and results taken a batch at a time: the headers of a batch written as one record array, the
values of its blocks quantized (or copied) as one (blocks x k) array straight into the send buffer's rows, the
values of a batch of results dequantized the same way into the tensor. With the C fast path (`wire.fastpath`)
the same loops run in C (`_fastpath.build_packets` / `take_results` / `block_exponents`), with the same results
to the bit. Results are written into the op's own tensor (in place): a block's values are read, quantized and
kept in the send buffer before its result can arrive, so the overwrite is safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope.innet.wire import fastpath
from stepscope.innet.wire import protocol as p
from stepscope.innet.wire.quantize import (
    NO_AGREED_EXPONENT,
    NOT_FINITE,
    TOO_LARGE,
    QuantizationError,
    block_exponents,
    dequantize_blocks,
    quantize_blocks,
)


class Op:
    """A submitted all-reduce: its blocks, agreed exponents, results and completion. `data_path`: 'c' or 'numpy'
    (None: the environment's choice, `wire.fastpath`)."""

    def __init__(self, op_id: int, array: np.ndarray, *, average: bool, min_count: int, preemptive: bool,
                 values_per_packet: int, slots: int, world: int, data_path: str | None = None) -> None:
        self.native = fastpath.resolve(data_path)
        self.op_id, self.array, self.average = op_id, array, average
        self.quantized = array.dtype == np.float32
        self.min_count, self.preemptive, self.world = min_count, preemptive, world
        self.k = values_per_packet
        self.n = len(array)
        self.blocks = -(-self.n // self.k)
        self.full = self.n // self.k  # blocks of exactly k values (the last may be shorter)
        self.prologue = min(slots, self.blocks) if self.quantized else 0
        self.packets = self.prologue + self.blocks
        self.own_exponent = self._exponents() if self.quantized else None
        self.agreed = np.full(self.blocks, p.NO_EXPONENT, dtype=np.int16)
        self.done = np.zeros(self.packets, bool)
        self.stamp = np.zeros(self.packets, np.int64)  # scratch: which result of a batch came first per packet
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

    def _exponents(self) -> np.ndarray:
        if self.native is None:
            return block_exponents(self.array, self.k)
        out = np.empty(self.blocks, np.int16)
        problem = self.native.block_exponents(self.array, self.k, out)
        if problem:
            raise QuantizationError(NOT_FINITE if problem == 1 else TOO_LARGE)
        return out

    # ---- mapping ---------------------------------------------------------------------------------
    def packets_of(self, prologue: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Packet index of each (phase, offset) of results, -1 where they do not fit this op."""
        block, rest = np.divmod(offsets.astype(np.int64), self.k)
        fits = (rest == 0) & (block < self.blocks) & ~(prologue & ((block >= self.prologue) | (not self.quantized)))
        return np.where(fits, np.where(prologue, block, self.prologue + block), -1)

    def sendable(self, q: np.ndarray) -> np.ndarray:
        """A data block needs its agreed exponent (from the result of packet `block`)."""
        if not self.quantized:
            return np.ones(len(q), bool)
        data = q >= self.prologue
        return ~data | (self.agreed[np.where(data, q - self.prologue, 0)] != p.NO_EXPONENT)

    # ---- packets ---------------------------------------------------------------------------------
    def build_into(self, q: np.ndarray, out: np.ndarray, rows: np.ndarray, versions: np.ndarray, job: int,
                   rank: int) -> np.ndarray:
        """Write packets `q` into rows `rows` of `out` (uint8, header + k values per row; `versions`: their slot
        versions; a row's slot is its index) and return their lengths."""
        if self.native is not None:
            lengths, clipped = np.empty(len(q), np.int64), np.empty(len(q), bool)
            late = self.native.build_packets(self, q, out, rows, versions, job, rank, lengths, clipped)
            if late < 0:
                raise QuantizationError(NO_AGREED_EXPONENT)
            if late:
                self.clipped.update((q[clipped] - self.prologue).tolist())  # blocks that do not fit the range
            return lengths
        prologue = q < self.prologue
        block = np.where(prologue, q, q - self.prologue)
        count = np.where(prologue, 0, np.minimum(self.k, self.n - block * self.k))
        header = np.zeros(len(q), p.HEADER_DTYPE)
        header["magic"], header["version"], header["type"] = p.MAGIC, p.PROTOCOL_VERSION, p.DATA
        header["job"], header["op"], header["offset"] = job, self.op_id, block * self.k
        header["slot"], header["rank"], header["world"] = rows, rank, self.world
        header["flags"] = versions | np.where(prologue, p.PROLOGUE, 0)
        header["count"], header["contributors"], header["op_flags"] = count, self.min_count, self.op_flags
        header["next_exponent"] = p.NO_EXPONENT
        data = np.flatnonzero(~prologue)
        if self.quantized:
            ahead = q < self.blocks  # packet q carries this rank's exponent of data block q
            header["next_exponent"][ahead] = self.own_exponent[q[ahead]]
            header["exponent"][data] = self.agreed[block[data]]
        out[rows, :p.HEADER_BYTES] = header.view(np.uint8).reshape(-1, p.HEADER_BYTES)
        words = out.view("<i4")[:, p.HEADER_BYTES // 4:]
        for blocks, width in self._by_width(block[data]):
            at, mine = rows[data][blocks], block[data][blocks]
            if self.quantized:
                agreed = self.agreed[mine].astype(np.int64)
                late = mine[self.own_exponent[mine] > agreed]
                if len(late):
                    self.clipped.update(late.tolist())  # its largest value does not fit the agreed range
            values = self._block_values(mine, width)
            if self.quantized:
                values = quantize_blocks(values, agreed, self.world, integers=False)
            words[at, :width] = values  # (rounded float64 values become int32 exactly here)
        return p.HEADER_BYTES + 4 * count

    def build(self, q: int, job: int, rank: int, slot: int, version: int) -> bytes:
        """One packet as bytes (the batch path with a batch of one)."""
        out = np.zeros((slot + 1, p.HEADER_BYTES + 4 * self.k), np.uint8)
        length = self.build_into(np.array([q]), out, np.array([slot]), np.array([version]), job, rank)
        return bytes(out[slot, :int(length[0])])

    def _by_width(self, block: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The data blocks as (positions, values per block): the full ones, and the short last one."""
        last = block == self.blocks - 1
        short = self.n - (self.blocks - 1) * self.k
        if short == self.k or not last.any():
            return [(np.arange(len(block)), self.k)] if len(block) else []
        groups = [(np.flatnonzero(~last), self.k), (np.flatnonzero(last), short)]
        return [(at, width) for at, width in groups if len(at)]

    def _block_values(self, block: np.ndarray, width: int) -> np.ndarray:
        if width == self.k:
            return self.array[:self.full * self.k].reshape(self.full, self.k)[block]
        return self.array[self.full * self.k:][None, :]

    # ---- results ---------------------------------------------------------------------------------
    def take_results(self, q: np.ndarray, h: np.ndarray, buffer: np.ndarray, offsets: np.ndarray) -> None:
        """Take results for packets `q` (headers `h`, the datagrams at byte `offsets` of `buffer`): the agreed
        exponents they bring and, for data blocks, the values, written into the tensor."""
        if self.native is not None:
            self.timed_out_blocks += self.native.take_results(self, buffer, offsets, q)
            self.remaining -= len(q)
            return

        def values(at: np.ndarray, width: int) -> np.ndarray:
            every = np.lib.stride_tricks.sliding_window_view(buffer, 4 * width)  # each datagram's values, in place
            return every[offsets[at] + p.HEADER_BYTES].view("<i4")

        if self.quantized:
            ahead = q < self.blocks
            self.agreed[q[ahead]] = h["next_exponent"][ahead]
        self.timed_out_blocks += int(np.count_nonzero(h["flags"] & (p.TIMEOUT | p.K_REACHED)))
        data = np.flatnonzero(q >= self.prologue)
        block = q[data] - self.prologue
        for blocks, width in self._by_width(block):
            at = data[blocks]
            ints = values(at, width)
            contributors = h["contributors"][at].astype(np.int64)
            if self.quantized:
                divisors = contributors if self.average else np.ones_like(contributors)
                result = dequantize_blocks(ints, h["exponent"][at], self.world, divisors)
            elif self.average:  # exact sum, then C's integer division (toward zero) by the real count
                result = truncated_average(ints, contributors)
            else:
                result = ints
            if width == self.k:
                self.array[:self.full * self.k].reshape(self.full, self.k)[block[blocks]] = result
            else:
                self.array[self.full * self.k:] = result[0]
        self.contributors[block] = h["contributors"][data]
        self.done[q] = True
        self.remaining -= len(q)

    def results_fit(self, q: np.ndarray, count: np.ndarray) -> np.ndarray:
        """A result's value count must be its block's size (prologue: none)."""
        block = q - self.prologue
        size = np.where(q < self.prologue, 0, np.minimum(self.k, self.n - block * self.k))
        return count == size

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


def truncated_average(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """C's integer division (toward zero) of each row of int32 `sums` by its count, through float64: |sum| <
    2^31 and count <= 1024, so a quotient that is not an integer is at least 1/1024 away from one, far more than
    float64's rounding error (< 2^-21 here): truncating the correctly rounded quotient is exact."""
    return np.trunc(sums / counts[:, None].astype(np.float64)).astype(np.int32)
