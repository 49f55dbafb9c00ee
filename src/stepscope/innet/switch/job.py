"""One job's aggregation state inside the switch: the slot pool, shadow versions, contributor bitmaps,
straggler timers, the bounded result history and the job's counters.

Each of the s slots has two rows (versions 0 and 1). A row holds one block at a time: its key (op, phase,
offset), who contributed (a bitmask of ranks), the running int32 sum, and, once complete, the result
datagram (kept to answer retransmissions and late ranks until the row is reused). A block with key newer
than the row's may take the row only when the row's block is complete: the self-clocked workers send
the block that reuses a row only after the block two uses earlier completed, so anything else is a
protocol violation (`bad`).

Completion: all `world` contributions (ok); K of them after the straggler timeout (to), counted from the
block's first contribution; or K at once when the op asks for preemptive completion (kr).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from stepscope.innet.wire import protocol as p

Send = tuple[bytes, list[Any]]  # (datagram, receiver addresses)
# A block open this long answers a retransmission with a STATUS (who is missing), so a waiting worker can
# say which rank stalls; earlier retransmissions are common (skew) and get no answer, to save the switch.
STATUS_AFTER_S = 0.1


class SwitchJob:
    """Aggregation state of one job; all methods run on the switch's single packet thread."""

    def __init__(self, job_id: int, world: int, params: p.JoinParams, now: float) -> None:
        self.job_id, self.world, self.params = job_id, world, params
        self.sto_s = params.sto_ticks * p.TICK_S
        rows = 2 * params.slots
        self.keys = [-1] * rows          # block key held by each row (-1: never used)
        self.complete = [False] * rows
        self.seen = [0] * rows           # bitmask of ranks that contributed
        self.count = [0] * rows
        self.min_count = [world] * rows  # fastest-K of the block's op
        self.meta: list[tuple[int, int, int, int, int] | None] = [None] * rows  # op, offset, n, exponent, op_flags
        self.next_exponent = [p.NO_EXPONENT] * rows
        self.result: list[bytes | None] = [None] * rows
        self.started = [0.0] * rows        # time of the block's first contribution
        self.sums = np.zeros((rows, params.values_per_packet), dtype="<i4")
        self.timers: dict[int, float] = {}   # row -> deadline; insertion order is deadline order (one STO)
        self.expired: set[int] = set()       # rows whose timer fired before K contributions arrived
        self.history: OrderedDict[int, bytes] = OrderedDict()
        self.members: list[Any] = [None] * world
        self.counters = {name: 0 for name in p.COUNTERS}
        self.last_active = now

    @staticmethod
    def memory_bytes(world: int, params: p.JoinParams) -> int:
        """Upper bound of the job's memory: the sums, the stored results, the history, the bitmaps."""
        packet = p.HEADER_BYTES + 4 * params.values_per_packet
        rows = 2 * params.slots
        return rows * (4 * params.values_per_packet + packet + 200) + params.history * (packet + 100) + world * 64

    @property
    def proven(self) -> bool:
        """True once a block completed: a real job, never evicted to make room for another."""
        counters = self.counters
        return counters["ok"] + counters["to"] + counters["kr"] > 0

    # ---- membership -------------------------------------------------------------------------------
    def join(self, rank: int, address: Any, now: float) -> int:
        self.members[rank] = address
        self.last_active = now
        return sum(m is not None for m in self.members)

    def leave(self, rank: int, address: Any) -> bool:
        """Forget a rank (only from its own address); True when nobody is left."""
        if self.members[rank] == address:
            self.members[rank] = None
        return all(m is None for m in self.members)

    def receivers(self) -> list[Any]:
        return [m for m in self.members if m is not None]

    # ---- contributions ----------------------------------------------------------------------------
    def contribute(self, h: p.Header, data: bytes, address: Any, now: float) -> list[Send]:
        """Add one DATA packet; returns what to send (result multicast, re-served result, status)."""
        counters = self.counters
        counters["rx"] += 1
        self.last_active = now
        prologue = bool(h.flags & p.PROLOGUE)
        if (h.rank >= self.world or self.members[h.rank] != address or h.slot >= self.params.slots
                or h.count > self.params.values_per_packet or (h.count == 0) != prologue
                or h.contributors > self.world or h.offset > p.MAX_OFFSET):
            counters["bad"] += 1
            return []
        if h.flags & p.RETRANSMIT:
            counters["re"] += 1
        key = p.block_key(h.op, prologue, h.offset)
        row = 2 * h.slot + (h.flags & p.VERSION)
        held = self.keys[row]
        bit = 1 << h.rank
        if key == held:
            return self._add_to_held(row, h, data, bit, address, now)
        if key > held:
            if held != -1 and not self.complete[row]:
                counters["bad"] += 1  # the row's previous block is still open: not a self-clocked sender
                return []
            return self._start_block(row, key, h, data, bit, now)
        # an older block than the row holds: a late rank, served from the history if it is still there
        counters["old"] += 1
        stored = self.history.get(key)
        if stored is None:
            stored = p.pack(p.RESULT, self.job_id, h.op, h.offset, h.slot, p.SWITCH_RANK, self.world,
                            (h.flags & (p.VERSION | p.PROLOGUE)) | p.OLD)
        return self._unicast(p.with_flags(stored, p.SERVED), address)

    def _add_to_held(self, row: int, h: p.Header, data: bytes, bit: int, address: Any, now: float) -> list[Send]:
        counters = self.counters
        if self.complete[row]:
            counters["dup" if self.seen[row] & bit else "old"] += 1
            return self._unicast(p.with_flags(self.result[row], p.SERVED), address)
        if self.seen[row] & bit:
            counters["dup"] += 1
            if now - self.started[row] < STATUS_AFTER_S:
                return []  # a retransmission while the block waits for others: nothing to answer yet
            status = p.pack(p.STATUS, self.job_id, h.op, h.offset, h.slot, p.SWITCH_RANK, self.world,
                            h.flags & (p.VERSION | p.PROLOGUE), contributors=self.count[row],
                            values=p.bitmap_words(self.seen[row], self.world))
            return self._unicast(status, address)
        op, offset, n, exponent, op_flags = self.meta[row]
        if h.count != n or h.exponent != exponent or h.op_flags != op_flags:
            counters["bad"] += 1  # contributions to one block must agree on size, exponent and op
            return []
        if n:
            self.sums[row, :n] += p.values_of(data, n)  # int32 wrap-around, as in the switch ALU
        self.seen[row] |= bit
        self.count[row] += 1
        self.next_exponent[row] = max(self.next_exponent[row], h.next_exponent)
        return self._maybe_complete(row)

    def _start_block(self, row: int, key: int, h: p.Header, data: bytes, bit: int, now: float) -> list[Send]:
        self.keys[row] = key
        self.complete[row] = False
        self.result[row] = None
        self.seen[row] = bit
        self.count[row] = 1
        self.min_count[row] = h.contributors or self.world
        self.meta[row] = (h.op, h.offset, h.count, h.exponent, h.op_flags)
        self.next_exponent[row] = h.next_exponent
        if h.count:
            self.sums[row, :h.count] = p.values_of(data, h.count)
        self.expired.discard(row)
        self.started[row] = now
        self.timers[row] = now + self.sto_s
        return self._maybe_complete(row)

    def _maybe_complete(self, row: int) -> list[Send]:
        count = self.count[row]
        if count >= self.world:
            return self._complete(row, "ok", 0)
        if count >= self.min_count[row]:
            if self.meta[row][4] & p.PREEMPTIVE:
                return self._complete(row, "kr", p.K_REACHED)
            if row in self.expired:
                return self._complete(row, "to", p.TIMEOUT)
        return []

    def _complete(self, row: int, reason: str, flag: int) -> list[Send]:
        op, offset, n, exponent, op_flags = self.meta[row]
        prologue = not (self.keys[row] >> 31) & 1
        slot, version = divmod(row, 2)
        result = p.pack(p.RESULT, self.job_id, op, offset, slot, p.SWITCH_RANK, self.world,
                        version | (p.PROLOGUE if prologue else 0) | flag, contributors=self.count[row],
                        exponent=exponent, next_exponent=self.next_exponent[row], op_flags=op_flags,
                        values=self.sums[row, :n] if n else None)
        self.complete[row] = True
        self.result[row] = result
        self.timers.pop(row, None)
        self.expired.discard(row)
        self.counters[reason] += 1
        if self.params.history:
            self.history[self.keys[row]] = result
            if len(self.history) > self.params.history:
                self.history.popitem(last=False)
        receivers = self.receivers()
        self.counters["tx"] += len(receivers)
        return [(result, receivers)]

    def _unicast(self, packet: bytes, address: Any) -> list[Send]:
        self.counters["tx"] += 1
        return [(packet, [address])]

    # ---- straggler timers -------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        for deadline in self.timers.values():
            return deadline
        return None

    def expire(self, now: float) -> list[Send]:
        """Fire every timer due by `now`: complete the blocks that have K contributions, mark the rest."""
        due = []
        for row, deadline in self.timers.items():
            if deadline > now:
                break
            due.append(row)
        sends: list[Send] = []
        for row in due:
            del self.timers[row]
            self.expired.add(row)
            sends.extend(self._maybe_complete(row))
        return sends
