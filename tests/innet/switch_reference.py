"""A per-packet switch written from the protocol definition in docs/innet.md, sharing no code with
`stepscope.innet.switch` or `stepscope.innet.wire` (its own struct format, Python ints, dicts and sets): the
reference the vectorised switch is tested against.

One packet at a time, a job's row = 2 x slot + version holds one block: key (op, phase, offset), contributors,
running int32 sum (wrap-around), and once complete the result datagram. Completion: world contributions (ok), K
after the straggler timer fired (to), or K at once when preemptive (kr). A newer block takes a row only once its
block completed; a duplicate is never added twice (a STATUS answers it once the block waited 0.1 s); a packet for
a completed block gets the result again (SERVED); an older block than the row holds is answered from a bounded
history of results (the last H completed), or with OLD.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

HEADER = struct.Struct("<2sBBIIIHHHHHHbbBB")
DATA, RESULT, STATUS = 1, 2, 6
VERSION, RETRANSMIT, PROLOGUE, TIMEOUT, K_REACHED, OLD, SERVED = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x100
PREEMPTIVE = 0x4
SWITCH = 0xFFFF


def datagram(type_, job, op, offset, slot, flags, world, count, contributors, exponent, next_exponent, op_flags,
             values=()):
    header = HEADER.pack(b"IN", 1, type_, job, op, offset, slot, SWITCH, world, flags, count, contributors, exponent,
                         next_exponent, op_flags, 0)
    return header + struct.pack(f"<{len(values)}i", *values)


def wrap(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


@dataclass
class Row:
    key: tuple
    op: int
    offset: int
    n: int
    exponent: int
    op_flags: int
    min_count: int
    started: float
    deadline: float
    order: int
    seen: set = field(default_factory=set)
    total: list = field(default_factory=list)
    next_exponent: int = -128
    complete: bool = False
    expired: bool = False
    result: bytes = b""


class ReferenceJob:
    """One job of a per-packet switch: `packet` returns [(datagram, [addresses])] in send order."""

    def __init__(self, job: int, world: int, k: int, slots: int, sto_s: float, history: int, members: list):
        self.job, self.world, self.k, self.slots, self.sto_s = job, world, k, slots, sto_s
        self.history_size, self.members = history, members
        self.rows: dict[int, Row] = {}
        self.history: deque = deque(maxlen=history)  # (key, result) of the last `history` completions
        self.counters = dict.fromkeys(("ok", "to", "kr", "re", "dup", "old", "bad", "rx", "tx"), 0)
        self.timers_started = 0

    def packet(self, data: bytes, source, now: float) -> list:
        (_, _, _, _, op, offset, slot, rank, world, flags, count, contributors, exponent, next_exponent,
         op_flags, _) = HEADER.unpack_from(data)
        c = self.counters
        c["rx"] += 1
        prologue = bool(flags & PROLOGUE)
        if (self.members[rank] != source or slot >= self.slots or count > self.k or (count == 0) != prologue
                or contributors > self.world or offset > 2**31 - 1):
            c["bad"] += 1
            return []
        if flags & RETRANSMIT:
            c["re"] += 1
        values = struct.unpack_from(f"<{count}i", data, 32)
        key = (op, 0 if prologue else 1, offset)
        index = 2 * slot + (flags & VERSION)
        row = self.rows.get(index)
        if row is not None and key == row.key:
            if row.complete:
                c["dup" if rank in row.seen else "old"] += 1
                return self._unicast(self._served(row.result), source)
            if rank in row.seen:
                c["dup"] += 1
                if now - row.started < 0.1:
                    return []
                bitmap = sum(1 << r for r in row.seen)
                words = [(bitmap >> (32 * i)) & 0xFFFFFFFF for i in range((self.world + 31) // 32)]
                status = datagram(STATUS, self.job, op, offset, slot, flags & (VERSION | PROLOGUE), self.world,
                                  len(words), len(row.seen), 0, -128, 0)
                return self._unicast(status + struct.pack(f"<{len(words)}I", *words), source)
            if count != row.n or exponent != row.exponent or op_flags != row.op_flags:
                c["bad"] += 1
                return []
            row.seen.add(rank)
            row.total = [wrap(a + b) for a, b in zip(row.total, values, strict=True)]
            row.next_exponent = max(row.next_exponent, next_exponent)
            return self._maybe_complete(index, row)
        if row is None or key > row.key:
            if row is not None and not row.complete:
                c["bad"] += 1
                return []
            row = self.rows[index] = Row(key, op, offset, count, exponent, op_flags, contributors or self.world, now,
                                         now + self.sto_s, self.timers_started, {rank}, list(values), next_exponent)
            self.timers_started += 1
            return self._maybe_complete(index, row)
        c["old"] += 1
        stored = next((result for held, result in reversed(self.history) if held == key), None)
        if stored is None:
            stored = datagram(RESULT, self.job, op, offset, slot, (flags & (VERSION | PROLOGUE)) | OLD, self.world,
                              0, 0, 0, -128, 0)
        return self._unicast(self._served(stored), source)

    def expire(self, now: float) -> list:
        due = sorted((row.deadline, row.order, index) for index, row in self.rows.items()
                     if not row.complete and not row.expired and row.deadline <= now)
        sends = []
        for _, _, index in due:
            self.rows[index].expired = True
            sends += self._maybe_complete(index, self.rows[index])
        return sends

    def _maybe_complete(self, index: int, row: Row) -> list:
        count = len(row.seen)
        if count >= self.world:
            return self._complete(index, row, "ok", 0)
        if count >= row.min_count and row.op_flags & PREEMPTIVE:
            return self._complete(index, row, "kr", K_REACHED)
        if count >= row.min_count and row.expired:
            return self._complete(index, row, "to", TIMEOUT)
        return []

    def _complete(self, index: int, row: Row, reason: str, flag: int) -> list:
        slot, version = divmod(index, 2)
        phase = 0 if row.key[1] else PROLOGUE
        row.result = datagram(RESULT, self.job, row.op, row.offset, slot, version | phase | flag, self.world, row.n,
                              len(row.seen), row.exponent, row.next_exponent, row.op_flags, row.total)
        row.complete = True
        self.counters[reason] += 1
        if self.history_size:
            self.history.append((row.key, row.result))
        receivers = [m for m in self.members if m is not None]
        self.counters["tx"] += len(receivers)
        return [(row.result, receivers)]

    @staticmethod
    def _served(result: bytes) -> bytes:
        flags = struct.unpack_from("<H", result, 22)[0] | SERVED
        return result[:22] + struct.pack("<H", flags) + result[24:]

    def _unicast(self, data: bytes, source) -> list:
        self.counters["tx"] += 1
        return [(data, [source])]
