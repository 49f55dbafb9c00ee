"""The job's packet stream on one worker: ops in submit order, which packet each slot sends next, and results
stashed for ops this rank has not submitted yet (it is late), kept as arrays and applied a batch at a time.

Stream packet i uses slot i mod s and version (i div s) mod 2. A slot carries one packet at a time:
packet i + s becomes ready only after the result of packet i arrived (self-clocking). A result that
arrives for a packet not sent yet (the block completed without this rank) marks the packet done, so a
straggler skips what the others finished and catches up. A data packet also waits for its block's agreed
exponent (the result of the packet that carried it); which packets are ready is worked out for all idle slots at
once (`ready`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from stepscope.innet.wire import protocol as p
from stepscope.innet.wire.batch_io import Datagrams
from stepscope.innet.worker.op import Op


class InnetError(RuntimeError):
    """The switch is unreachable, rejected the job, or an op could not complete."""


@dataclass
class WorkerCounters:
    """What this worker did (its side of the switch's counters)."""

    sent: int = 0
    retransmitted: int = 0
    results: int = 0
    duplicate_results: int = 0
    skipped: int = 0
    status_replies: int = 0
    stashed: int = 0
    stash_dropped: int = 0
    clipped_blocks: int = 0
    """Data blocks sent clipped to an exponent agreed without this rank (`Op.clipped`): not exact."""


class Stream:
    """Slot bookkeeping of one worker (used by the engine's I/O thread only)."""

    def __init__(self, slots: int, rank: int, stash_limit_bytes: int, counters: WorkerCounters,
                 native: ModuleType | None = None) -> None:
        self.s, self.rank, self.stash_limit_bytes, self.counters = slots, rank, stash_limit_bytes, counters
        self.native = native  # the C fast path (`wire.fastpath`) takes the usual batch of results at once
        self._tag = 0  # marks a batch's results in the ops' stamps on that path (negative, one per batch)
        self.end = 0  # next free stream index
        self.ops: dict[int, Op] = {}
        self.order: list[Op] = []  # admitted ops in stream order; finished ones leave from the front
        self.bases = np.zeros(0, np.int64)
        self.last_admitted = 0
        self.slot_next = np.arange(slots, dtype=np.int64)
        self.stash: dict[int, list[bytes]] = {}
        self.stash_bytes = 0

    def admit(self, op: Op, apply_stashed: Callable[[list[bytes]], None]) -> None:
        """Append an op to the stream and take the results that came before it (`apply_stashed`)."""
        op.base = self.end
        self.end += op.packets
        self.last_admitted = op.op_id
        self.ops[op.op_id] = op
        self.order.append(op)
        self.bases = np.append(self.bases, op.base)
        if op.packets == 0:
            self._complete(op)
            return
        stashed = self.stash.pop(op.op_id, [])
        if stashed:  # results that came before this rank got here
            self.stash_bytes -= sum(len(data) for data in stashed)
            apply_stashed(stashed)

    def ready(self, idle: np.ndarray, limit: int) -> list[tuple[Op, np.ndarray, np.ndarray]]:
        """Up to `limit` packets to send now on the `idle` slots, lowest stream index first, per op: (op, packet
        indices in the op, their slots). Packets whose result is already here are skipped on the way."""
        slots = np.flatnonzero(idle & (self.slot_next < self.end))
        while len(slots):
            index = self.slot_next[slots]
            which = np.searchsorted(self.bases, index, side="right") - 1
            done = which < 0  # the op finished and left the stream
            for i, mine in _groups(which):
                if i >= 0:
                    op = self.order[i]
                    done[mine] = op.done[index[mine] - op.base]
            if not done.any():
                break
            self.counters.skipped += int(np.count_nonzero(done & (which >= 0)))
            self.slot_next[slots[done]] += self.s
            slots = slots[self.slot_next[slots] < self.end]
        if not len(slots) or limit <= 0:
            return []
        index = self.slot_next[slots]
        which = np.searchsorted(self.bases, index, side="right") - 1
        sendable = np.zeros(len(slots), bool)
        for i, mine in _groups(which):
            sendable[mine] = self.order[i].sendable(index[mine] - self.order[i].base)
        first = np.argsort(index[sendable], kind="stable")[:limit]
        slots, index, which = slots[sendable][first], index[sendable][first], which[sendable][first]
        return [(self.order[i], index[mine] - self.order[i].base, slots[mine]) for i, mine in _groups(which)]

    def apply_batch(self, batch: Datagrams, job_id: int) -> np.ndarray | None:
        """The usual batch, only results of ops in flight and none OLD, taken in C with `apply`'s decisions
        (`_fastpath.take_batch`): the stream indices completed; None when the batch is for `apply`."""
        if self.native is None or not self.ops or any(op.native is None for op in self.ops.values()):
            return None
        self._tag -= 1
        out = np.empty(len(batch), np.int64)
        taken = self.native.take_batch(self.ops, batch.buffer, batch.offsets, batch.lengths, job_id, self._tag, out)
        if taken is None:
            return None
        self.counters.results += taken[0]
        self.counters.duplicate_results += taken[1]
        index = out[:taken[0]]
        for _, mine in _groups(np.searchsorted(self.bases, index, side="right") - 1):  # op by op, as `apply`
            slot = index[mine] % self.s
            moves = self.slot_next[slot] == index[mine]
            self.slot_next[slot[moves]] += self.s
        for op in [op for op in self.ops.values() if op.remaining == 0]:
            self._complete(op)
        return index

    def apply(self, h: np.ndarray, buffer: np.ndarray, offsets: np.ndarray,
              datagram: Callable[[int], bytes]) -> np.ndarray:
        """Take a batch of RESULT packets (headers `h`, the datagrams at byte `offsets` of `buffer`; `datagram(i)`
        one of them as bytes); returns the stream indices they completed (stashed, duplicate, foreign: none)."""
        applied = []
        for op_id, which in _groups(h["op"]):
            mine = np.arange(len(h)) if isinstance(which, slice) else np.flatnonzero(which)
            op = self.ops.get(op_id)
            if op is None:
                if op_id > self.last_admitted:
                    for i in mine[(h["flags"][mine] & p.OLD) == 0].tolist():
                        self._stash(op_id, datagram(i))
                continue  # else: a duplicate for an op that already finished
            q = op.packets_of((h["flags"][mine] & p.PROLOGUE) != 0, h["offset"][mine])
            known, position = np.maximum(q, 0), np.arange(len(q))
            fits = q >= 0
            op.stamp[q[fits][::-1]] = position[fits][::-1]  # duplicates: the first one's position is written last
            fresh = fits & (op.stamp[known] == position) & ~op.done[known]  # one result per packet
            self.counters.duplicate_results += int(np.count_nonzero(~fresh))
            late = fresh & ((h["flags"][mine] & p.OLD) != 0)
            if late.any():
                offset = int(h["offset"][mine][late][0])
                raise InnetError(f"block at offset {offset} of allreduce.{op_id} completed without rank "
                                 f"{self.rank} and the switch no longer holds it (this rank fell more than the "
                                 f"job's result history behind)")
            fresh &= op.results_fit(np.maximum(q, 0), h["count"][mine].astype(np.int64))
            take = mine[fresh]
            op.take_results(q[fresh], h if op.native is not None else p.take_headers(h, take), buffer, offsets[take])
            self.counters.results += len(take)
            index = op.base + q[fresh]
            slot = index % self.s
            moves = self.slot_next[slot] == index
            self.slot_next[slot[moves]] += self.s
            applied.append(index)
            if op.remaining == 0:
                self._complete(op)
        return np.concatenate(applied) if applied else np.zeros(0, np.int64)

    def _stash(self, op_id: int, data: bytes) -> None:
        if self.stash_bytes + len(data) > self.stash_limit_bytes:
            self.counters.stash_dropped += 1  # recovered later by retransmission (history) or an error
            return
        self.stash.setdefault(op_id, []).append(data)
        self.stash_bytes += len(data)
        self.counters.stashed += 1

    def _complete(self, op: Op) -> None:
        self.ops.pop(op.op_id, None)
        self.counters.clipped_blocks += len(op.clipped)
        op.finish()
        # finished ops leave the front of the stream: their packets count as done from then on
        gone = 0
        while gone < len(self.order) and self.order[gone].event.is_set():
            gone += 1
        if gone:
            del self.order[:gone]
            self.bases = self.bases[gone:]


def _groups(values: np.ndarray) -> list[tuple[int, np.ndarray | slice]]:
    """(value, where) of each distinct value, in increasing order; `where` is a boolean mask, or slice(None) when
    every element holds the value (the usual batch: one op), which spares the masks."""
    if not len(values):
        return []
    first = int(values[0])
    if values[-1] == first and (values == first).all():
        return [(first, slice(None))]
    return [(value, values == value) for value in np.unique(values).tolist()]
