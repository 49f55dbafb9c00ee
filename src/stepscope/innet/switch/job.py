"""One job's aggregation state inside the switch, as arrays over its rows: the slot pool, shadow versions,
contributor bitmaps, straggler timers, the bounded result history and the job's counters.

Each of the s slots has two rows (versions 0 and 1); row = 2 x slot + version. A row holds one block at a time:
its key (op, phase, offset), who contributed (a bitmap of ranks), the running int32 sum, and, once complete, the
result datagram (kept to answer retransmissions and late ranks until the row is reused). The sum lives inside
that datagram (`datagrams[row]` = 32-byte header + k int32 values), so completing a block writes its header and
sends the row as it is. A block with a key newer than the row's may take the row only when the row's block is
complete: the self-clocked workers send the block that reuses a row only after the block two uses earlier
completed, so anything else is a protocol violation (`bad`).

Completion: all `world` contributions (ok); K of them after the straggler timeout (to), counted from the
block's first contribution; or K at once when the op asks for preemptive completion (kr). How a batch of
contributions is applied: `switch.aggregate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.innet.switch.outbox import Outbox
from stepscope.innet.wire import protocol as p

# A block open this long answers a retransmission with a STATUS (who is missing), so a waiting worker can
# say which rank stalls; earlier retransmissions are common (skew) and get no answer, to save the switch.
STATUS_AFTER_S = 0.1
NONE = np.uint64(0)  # a member key no address has (address 0.0.0.0 port 0)


class SwitchJob:
    """Aggregation state of one job; all methods run on the switch's packet thread."""

    def __init__(self, job_id: int, world: int, params: p.JoinParams, now: float) -> None:
        self.job_id, self.world, self.params = job_id, world, params
        self.slots, self.k = params.slots, params.values_per_packet
        self.sto_s = params.sto_ticks * p.TICK_S
        rows = 2 * params.slots
        self.used = np.zeros(rows, bool)             # the row has held a block
        self.keys = np.zeros(rows, np.uint64)        # block key held by each used row (`protocol.block_key`)
        self.complete = np.zeros(rows, bool)
        self.seen = np.zeros((rows, (world + 63) // 64), np.uint64)  # contributor bitmap, 64 ranks per word
        self.count = np.zeros(rows, np.int64)
        self.min_count = np.full(rows, world, np.int64)  # fastest-K of the block's op
        self.n = np.zeros(rows, np.int64)            # values of the block
        self.exponent = np.zeros(rows, np.int8)
        self.op_flags = np.zeros(rows, np.uint8)
        self.next_exponent = np.full(rows, p.NO_EXPONENT, np.int8)
        self.started = np.zeros(rows)                # time of the block's first contribution
        self.deadline = np.full(rows, np.inf)        # straggler timer (inf: none running)
        self.timer_order = np.zeros(rows, np.int64)  # ties of equal deadlines fire in start order
        self.expired = np.zeros(rows, bool)          # the timer fired before K contributions arrived
        self.stride = p.HEADER_BYTES + 4 * self.k
        self.datagrams = np.zeros((rows, self.stride), np.uint8)
        self.result_template = np.zeros((), p.HEADER_DTYPE)  # the header fields no block changes
        for name, value in (("magic", p.MAGIC), ("version", p.PROTOCOL_VERSION), ("type", p.RESULT),
                            ("job", job_id), ("rank", p.SWITCH_RANK), ("world", world)):
            self.result_template[name] = value
        self.sums = self.datagrams.view("<i4")[:, p.HEADER_BYTES // 4:]  # (rows, k): int32, wrap-around
        self.history = History(params.history, self.stride)
        self.members: list[Any] = [None] * world
        self.member_keys = np.zeros(world, np.uint64)  # address key of each rank (`batch_io.address_key`)
        self.member_dests = np.full(world, -1, np.int64)  # the switch's destination index of each rank
        self.counters = {name: 0 for name in p.COUNTERS}
        self.last_active = now
        self.timers_started = 0
        self.fast: Any = None  # the C fast path's views of these arrays (`switch.fast_batch`), made on first use

    @staticmethod
    def memory_bytes(world: int, params: p.JoinParams) -> int:
        """Upper bound of the job's memory: the sums in their result datagrams, the history, the bitmaps."""
        packet = p.HEADER_BYTES + 4 * params.values_per_packet
        rows = 2 * params.slots
        return rows * (4 * params.values_per_packet + packet + 200) + params.history * (packet + 100) + world * 64

    @property
    def proven(self) -> bool:
        """True once a block completed: a real job, never evicted to make room for another."""
        counters = self.counters
        return counters["ok"] + counters["to"] + counters["kr"] > 0

    # ---- membership -------------------------------------------------------------------------------
    def join(self, rank: int, address: Any, key: int, dest: int, now: float) -> int:
        self.members[rank] = address
        self.member_keys[rank] = key
        self.member_dests[rank] = dest
        self.last_active = now
        return sum(m is not None for m in self.members)

    def leave(self, rank: int, address: Any) -> bool:
        """Forget a rank (only from its own address); True when nobody is left."""
        if self.members[rank] == address:
            self.members[rank] = None
            self.member_keys[rank] = NONE
            self.member_dests[rank] = -1
        return all(m is None for m in self.members)

    def receivers(self) -> np.ndarray:
        """Destination indices of the ranks in the job, in rank order."""
        return self.member_dests[self.member_dests >= 0]

    # ---- completion -------------------------------------------------------------------------------
    def complete_rows(self, rows: np.ndarray, flags: np.ndarray, order: np.ndarray, outbox: Outbox) -> None:
        """Complete `rows` (in completion order; `flags`: 0, TIMEOUT or K_REACHED; `order`: the packet that
        completed each): write their result headers, count them, keep them in the history, multicast them."""
        if not len(rows):
            return
        keys = self.keys[rows]
        header = np.full(len(rows), self.result_template)
        header["op"] = keys >> np.uint64(32)
        header["offset"] = keys & np.uint64(0x7FFFFFFF)
        header["slot"] = rows // 2
        data = (keys >> np.uint64(31)) & np.uint64(1)
        header["flags"] = (rows % 2) | np.where(data == 0, p.PROLOGUE, 0) | flags
        header["count"], header["contributors"] = self.n[rows], self.count[rows]
        header["exponent"], header["next_exponent"] = self.exponent[rows], self.next_exponent[rows]
        header["op_flags"] = self.op_flags[rows]
        self.datagrams[rows, :p.HEADER_BYTES] = header.view(np.uint8).reshape(-1, p.HEADER_BYTES)  # as bytes: fast
        self.complete[rows] = True
        self.deadline[rows] = np.inf
        self.expired[rows] = False
        for name, flag in (("ok", 0), ("to", p.TIMEOUT), ("kr", p.K_REACHED)):
            self.counters[name] += int(np.count_nonzero(flags == flag))
        self.history.insert(keys, self.datagrams[rows])
        receivers = self.receivers()
        copies = len(receivers)
        self.counters["tx"] += copies * len(rows)
        outbox.add(np.repeat(order, copies), self.datagrams, np.repeat(rows * self.stride, copies),
                   np.repeat(p.HEADER_BYTES + 4 * self.n[rows], copies), np.tile(receivers, len(rows)))

    def serve(self, rows: np.ndarray, dests: np.ndarray, order: np.ndarray, outbox: Outbox) -> None:
        """Send the completed results of `rows` again, one to each of `dests` (flagged SERVED)."""
        if not len(rows):
            return
        copies = self.datagrams[rows]  # the SERVED flag goes on copies: the rows keep the multicast datagram
        copies[:, 22:24].view("<u2")[:, 0] |= p.SERVED
        self.counters["tx"] += len(rows)
        outbox.add(order, copies.reshape(-1), np.arange(len(rows)) * self.stride,
                   p.HEADER_BYTES + 4 * self.n[rows], dests)

    # ---- straggler timers -------------------------------------------------------------------------
    def start_timers(self, rows: np.ndarray, now: float) -> None:
        self.started[rows] = now
        self.deadline[rows] = now + self.sto_s
        self.timer_order[rows] = self.timers_started + np.arange(len(rows))
        self.timers_started += len(rows)
        self.expired[rows] = False

    def next_deadline(self) -> float | None:
        deadline = float(self.deadline.min())
        return deadline if deadline != np.inf else None

    def expire(self, now: float, outbox: Outbox | None = None) -> list[tuple[bytes, list[Any]]]:
        """Fire every timer due by `now`, in deadline order: complete the blocks that have K contributions
        (`to`), mark the rest. With no outbox, returns what to send as (datagram, addresses) (tests)."""
        box = outbox if outbox is not None else Outbox()
        due = np.flatnonzero(self.deadline <= now)
        due = due[np.lexsort((self.timer_order[due], self.deadline[due]))]
        self.deadline[due] = np.inf
        self.expired[due] = True
        done = due[self.count[due] >= self.min_count[due]]  # preemptive blocks completed at K already
        self.complete_rows(done, np.full(len(done), p.TIMEOUT), np.arange(len(done)), box)
        return [] if outbox is not None else self.addressed(box)

    def addressed(self, outbox: Outbox) -> list[tuple[bytes, list[Any]]]:
        """An outbox's datagrams with the member addresses its destinations stand for."""
        names = {int(d): self.members[r] for r, d in enumerate(self.member_dests) if d >= 0}
        return [(data, [names[d] for d in dests]) for data, dests in outbox.datagrams()]


class History:
    """The last `size` completed results of a job, for ranks that fall behind: a ring of datagrams, oldest out.
    Each entry keeps its insertion number, which says whether it is still held after a given number of later
    insertions; a lookup (only late packets ask) scans the ring's keys."""

    def __init__(self, size: int, stride: int) -> None:
        self.size = size
        self.ring = np.zeros((size, stride), np.uint8)  # pages are only touched once used
        self.ring_keys = np.zeros(size, np.uint64)
        self.ring_numbers = np.full(size, -1, np.int64)
        self.inserted = 0

    def insert(self, keys: np.ndarray, datagrams: np.ndarray) -> None:
        """Keep the results `datagrams` of `keys`, in completion order (the oldest beyond `size` go)."""
        total = len(keys)
        if not self.size or not total:
            return
        kept = min(total, self.size)  # of more than `size` at once, the earlier ones would go at once
        numbers = self.inserted + total - kept + np.arange(kept)
        first = int(numbers[0]) % self.size
        where = slice(first, first + kept) if first + kept <= self.size else numbers % self.size
        self.ring[where] = datagrams[total - kept:]
        self.ring_keys[where] = keys[total - kept:]
        self.ring_numbers[where] = numbers
        self.inserted += total

    def lookup(self, key: int, later: int = 0) -> np.ndarray | None:
        """The stored result of `key`, if it is still held after `later` more insertions; else None."""
        oldest = max(0, self.inserted + later - self.size)
        held = np.flatnonzero((self.ring_keys == key) & (self.ring_numbers >= oldest))
        if not len(held):
            return None
        return self.ring[held[np.argmax(self.ring_numbers[held])]]
