"""The job's packet stream on one worker: ops in submit order, which packet each slot sends next, the
ready queue, data packets waiting for their agreed exponent, and results stashed for ops this rank has
not submitted yet (it is late).

Stream packet i uses slot i mod s and version (i div s) mod 2. A slot carries one packet at a time:
packet i + s becomes ready only after the result of packet i arrived (self-clocking). A result that
arrives for a packet not sent yet (the block completed without this rank) marks the packet done, so a
straggler skips what the others finished and catches up.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from stepscope.innet.wire import protocol as p
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

    def __init__(self, slots: int, rank: int, stash_limit_bytes: int, counters: WorkerCounters) -> None:
        self.s, self.rank, self.stash_limit_bytes, self.counters = slots, rank, stash_limit_bytes, counters
        self.end = 0  # next free stream index
        self.ops: dict[int, Op] = {}
        self.bases: list[int] = []
        self.order: list[Op] = []
        self.last_admitted = 0
        self.slot_next = list(range(slots))
        self.ready: deque[int] = deque()
        self.parked: dict[tuple[int, int], tuple[int, int]] = {}  # (op id, block) -> (slot, stream index)
        self.stash: dict[int, list[bytes]] = {}
        self.stash_bytes = 0

    def admit(self, op: Op) -> None:
        """Append an op to the stream, take the results that came before it, wake the idle slots."""
        op.base = self.end
        self.end += op.packets
        self.last_admitted = op.op_id
        self.ops[op.op_id] = op
        self.bases.append(op.base)
        self.order.append(op)
        if op.packets == 0:
            self._complete(op)
            return
        for data in self.stash.pop(op.op_id, []):  # results that came before this rank got here
            self.stash_bytes -= len(data)
            self.apply(p.unpack(data), data)
        for slot in range(self.s):
            if op.base <= self.slot_next[slot] < self.end:
                self._advance(slot)

    def pop_ready(self, outstanding: dict) -> tuple[int, Op, int] | None:
        """The next packet to send (stream index, op, packet index in the op), or None."""
        while self.ready:
            index = self.ready.popleft()
            if self.slot_next[index % self.s] != index or index in outstanding:
                continue  # stale entry: the slot moved on (its result came first)
            op, q = self._locate(index)
            if op is None or op.done[q]:
                self._advance(index % self.s)
                continue
            return index, op, q
        return None

    def apply(self, h: p.Header, data: bytes) -> int | None:
        """Take a RESULT; returns the stream index it completed, or None (stashed, duplicate, foreign)."""
        op = self.ops.get(h.op)
        if op is None:
            if h.op > self.last_admitted and not h.flags & p.OLD:
                self._stash(h.op, data)
            return None  # else: a duplicate for an op that already finished
        q = op.packet_of(bool(h.flags & p.PROLOGUE), h.offset)
        if q is None or op.done[q]:
            self.counters.duplicate_results += 1
            return None
        if h.flags & p.OLD:
            raise InnetError(f"block at offset {h.offset} of allreduce.{h.op} completed without rank "
                             f"{self.rank} and the switch no longer holds it (this rank fell more than the "
                             f"job's result history behind)")
        if not op.result_fits(q, h):
            return None
        op.apply_result(q, h, data)
        self.counters.results += 1
        index = op.base + q
        slot = index % self.s
        if self.slot_next[slot] == index:
            self.slot_next[slot] = index + self.s
            self._advance(slot)
        if q < op.blocks and op.quantized:
            waiting = self.parked.pop((op.op_id, q), None)  # the data block whose exponent just came
            if waiting is not None and self.slot_next[waiting[0]] == waiting[1]:
                self._advance(waiting[0])
        if op.remaining == 0:
            self._complete(op)
        return index

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
        while self.order and self.order[0].event.is_set():
            self.order.pop(0)
            self.bases.pop(0)

    def _locate(self, index: int) -> tuple[Op | None, int]:
        """The op holding stream packet `index` and the packet's index in it (None: finished op)."""
        i = bisect.bisect_right(self.bases, index) - 1
        if i < 0:
            return None, 0
        op = self.order[i]
        return (op, index - op.base) if index < op.base + op.packets else (None, 0)

    def _advance(self, slot: int) -> None:
        """Queue the slot's next packet to send, skipping packets whose result is already here."""
        while True:
            index = self.slot_next[slot]
            if index >= self.end:
                return  # nothing submitted for this slot yet; `admit` resumes it
            op, q = self._locate(index)
            if op is None or op.done[q]:
                if op is not None:
                    self.counters.skipped += 1
                self.slot_next[slot] = index + self.s
                continue
            if not op.can_send(q):
                self.parked[(op.op_id, op.block_of(q))] = (slot, index)  # waits for its agreed exponent
                return
            self.ready.append(index)
            return
