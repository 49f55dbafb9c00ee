"""A batch of DATA packets applied to one job at once, with exactly the outcome of applying them one at a time in
arrival order (the protocol's definition; tests/innet/test_aggregate.py checks this against a per-packet
reference written from docs/innet.md).

Rows are independent: a row's outcome depends only on its own packets, in their order. So the batch is grouped by
row (a stable sort keeps each row's arrival order) and every row's packets are resolved together:

- a packet for an older block than the row holds is a late rank's: `old`, answered from the history;
- a newer block may take the row only if the row's block is complete (else the packets are `bad`); its first
  packet starts the block;
- while the block is open, a rank's first packet that agrees with the block (size, exponent, op flags) adds its
  values; a rank already counted is a `dup` (answered with a STATUS once the block waited 0.1 s); a packet that
  disagrees is `bad`; the block completes at the packet that brings the count to `world` (or to K, preemptively
  or after the timer fired), and every later packet of the row gets the result again (`dup` or `old`).

Sums are segment sums over the row-sorted contributions (`np.add.reduceat`, int32 wrap-around like the switch's
ALU: addition modulo 2^32 is associative, so the order does not change the result). A row that sees two different
blocks within one batch (a stale retransmission among fresh packets) cannot be resolved that way: the batch is cut
before such a packet into segments applied one after the other (`segments`). Completions go into the history and
the outbox in the order of the packets that caused them, so even which late packet still finds its result in the
history is what a packet-at-a-time switch would decide.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stepscope.innet.switch.job import STATUS_AFTER_S, SwitchJob
from stepscope.innet.switch.outbox import Outbox
from stepscope.innet.wire import protocol as p

_U64 = np.uint64


def block_keys(h: np.ndarray) -> np.ndarray:
    """`protocol.block_key` of every header: op, then the prologue before data, then offset (uint64)."""
    data = (h["flags"] & p.PROLOGUE) == 0
    return ((h["op"].astype(_U64) << _U64(32)) | (data.astype(_U64) << _U64(31))
            | h["offset"].astype(_U64))


def contribute(job: SwitchJob, h: np.ndarray, order: np.ndarray, buffer: np.ndarray, offsets: np.ndarray,
               sources: np.ndarray, now: float, outbox: Outbox) -> None:
    """Apply the DATA packets `h` (headers, in arrival order; their datagrams at byte `offsets` of `buffer`, sent
    from `sources`) of `job`'s ranks; `order` tags each packet's answers in `outbox`."""
    counters = job.counters
    counters["rx"] += len(h)
    job.last_active = now
    rank = h["rank"].astype(np.int64)
    count = h["count"].astype(np.int64)
    prologue = (h["flags"] & p.PROLOGUE) != 0
    fits = ((job.member_keys[rank] == sources) & (h["slot"] < job.slots) & (count <= job.k)
            & ((count == 0) == prologue) & (h["contributors"] <= job.world) & (h["offset"] <= p.MAX_OFFSET))
    if not fits.all():
        counters["bad"] += int(np.count_nonzero(~fits))
        h, order, offsets = h[fits], order[fits], offsets[fits]
    counters["re"] += int(np.count_nonzero(h["flags"] & p.RETRANSMIT))
    rows = 2 * h["slot"].astype(np.int64) + (h["flags"] & p.VERSION)
    keys = block_keys(h)
    for number, part in enumerate(segments(rows, keys)):
        if number:
            outbox.freeze()  # this piece may reuse rows whose results the earlier pieces queued
        _segment(job, h[part], rows[part], keys[part], order[part], buffer, offsets[part], now, outbox)


def segments(rows: np.ndarray, keys: np.ndarray) -> Iterator[slice]:
    """Consecutive pieces of the batch within which every row sees a single block key."""
    start, total = 0, len(rows)
    while start < total:
        r, k = rows[start:], keys[start:]
        by_row = np.argsort(r, kind="stable")
        first = np.ones(len(r), bool)
        first[1:] = r[by_row][1:] != r[by_row][:-1]
        group_key = k[by_row][first][np.cumsum(first) - 1]
        clash = by_row[k[by_row] != group_key]
        end = total if not len(clash) else start + int(clash.min())
        yield slice(start, end)
        start = end


def _segment(job: SwitchJob, h: np.ndarray, rows: np.ndarray, keys: np.ndarray, order: np.ndarray,
             buffer: np.ndarray, offsets: np.ndarray, now: float, outbox: Outbox) -> None:
    counters = job.counters
    by_row = np.argsort(rows, kind="stable")
    h, rows, keys, order, offsets = h[by_row], rows[by_row], keys[by_row], order[by_row], offsets[by_row]
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    group = np.cumsum(first) - 1
    row, key = rows[first], keys[first]  # per group: its row and the one block key its packets carry
    used, held, complete = job.used[row], job.keys[row], job.complete[row]
    older = used & (key < held)
    newer = ~used | (key > held)
    blocked = newer & used & ~complete  # the row's block is still open: not a self-clocked sender
    fresh = newer & ~blocked
    adding = fresh | (used & (key == held) & ~complete)
    counters["bad"] += int(np.count_nonzero(blocked[group]))
    _start_blocks(job, row[fresh], h[first][fresh], key[fresh], now)

    # the open blocks: who adds, who is a duplicate, who disagrees, where each block completes
    mine = adding[group]
    rank = h["rank"].astype(np.int64)
    word, bit = rank >> 6, _U64(1) << (rank & 63).astype(_U64)
    agrees = ((h["count"] == job.n[rows]) & (h["exponent"] == job.exponent[rows])
              & (h["op_flags"] == job.op_flags[rows]) & mine)
    counted_before = (job.seen[rows, word] & bit) != 0
    position = np.arange(len(rows))
    who = group * job.world + rank
    candidates = np.flatnonzero(agrees & ~counted_before)
    _, first_of_rank = np.unique(who[candidates], return_index=True)
    adds = np.zeros(len(rows), bool)
    adds[candidates[first_of_rank]] = True  # a rank's first agreeing packet (arrival order within the row)
    added_at = _where_added(who, adds)
    total = np.cumsum(adds)
    before_group = (total - adds)[first][group]  # adds before this row's first packet
    tally = job.count[rows] + total - before_group  # the row's count after this packet
    sto = job.expired[rows] | ((job.op_flags[rows] & p.PREEMPTIVE) != 0)
    needed = np.where(sto, np.minimum(job.min_count[rows], job.world), job.world)
    reaches = adds & (tally >= needed)
    done_at = np.full(len(row), len(rows))
    np.minimum.at(done_at, group[reaches], position[reaches])
    after = mine & (position > done_at[group])
    adds &= ~after
    duplicate = mine & ~adds & ~after & (counted_before | (added_at < position))
    counters["bad"] += int(np.count_nonzero(mine & ~adds & ~after & ~duplicate))
    counters["dup"] += int(np.count_nonzero(duplicate))
    _status_replies(job, np.flatnonzero(duplicate), rows, rank, adds, position, first, group, order, now, outbox)
    _add(job, rows, word, bit, h, adds, fresh[group], buffer, offsets)

    # completions, in the order of the packets that completed them
    completing = position[reaches & (position == done_at[group])]
    completing = completing[np.argsort(order[completing], kind="stable")]
    flags = np.where(tally[completing] >= job.world, 0,
                     np.where((job.op_flags[rows[completing]] & p.PREEMPTIVE) != 0, p.K_REACHED, p.TIMEOUT))
    _old(job, np.flatnonzero(older[group]), h, keys, order, order[completing], outbox)
    job.complete_rows(rows[completing], flags, order[completing], outbox)

    # packets that find their block complete get its result again: dup if their rank is in it, else old
    served = after | (used & (key == held) & complete)[group]
    in_result = (job.seen[rows, word] & bit) != 0
    counters["dup"] += int(np.count_nonzero(served & in_result))
    counters["old"] += int(np.count_nonzero(served & ~in_result))
    job.serve(rows[served], job.member_dests[rank[served]], order[served], outbox)


def _where_added(who: np.ndarray, adds: np.ndarray) -> np.ndarray:
    """For each packet, the position of the packet that added its rank to its row (len: none did)."""
    added = np.flatnonzero(adds)
    by_who = np.argsort(who[added])
    known = who[added][by_who]
    at = np.minimum(np.searchsorted(known, who), max(len(known) - 1, 0))
    found = (known[at] == who) if len(known) else np.zeros(len(who), bool)
    return np.where(found, added[by_who][at] if len(known) else 0, len(who))


def _start_blocks(job: SwitchJob, rows: np.ndarray, h: np.ndarray, keys: np.ndarray, now: float) -> None:
    """The rows take new blocks, described by their first packets `h` (which are counted by `_add`)."""
    job.used[rows], job.keys[rows], job.complete[rows] = True, keys, False
    job.seen[rows] = 0
    job.count[rows] = 0
    contributors = h["contributors"].astype(np.int64)
    job.min_count[rows] = np.where(contributors > 0, contributors, job.world)
    job.n[rows], job.exponent[rows], job.op_flags[rows] = h["count"], h["exponent"], h["op_flags"]
    job.next_exponent[rows] = p.NO_EXPONENT
    job.start_timers(rows, now)


def _add(job: SwitchJob, rows: np.ndarray, word: np.ndarray, bit: np.ndarray, h: np.ndarray, adds: np.ndarray,
         fresh: np.ndarray, buffer: np.ndarray, offsets: np.ndarray) -> None:
    """Count the adding packets and add their values into their rows' sums (fresh rows: replace)."""
    r = rows[adds]
    np.bitwise_or.at(job.seen, (r, word[adds]), bit[adds])
    np.add.at(job.count, r, 1)
    np.maximum.at(job.next_exponent, r, h["next_exponent"][adds])
    n = job.n[rows]
    for size in np.unique(n[adds & (n > 0)]).tolist():
        pick = np.flatnonzero(adds & (n == size))  # row-sorted: each row's packets are one run
        values = np.lib.stride_tricks.sliding_window_view(buffer, 4 * size)[offsets[pick] + p.HEADER_BYTES]
        starts = np.flatnonzero(np.r_[True, rows[pick][1:] != rows[pick][:-1]])
        sums = np.add.reduceat(values.view("<i4"), starts, axis=0)
        target, new = rows[pick][starts], fresh[pick][starts]
        job.sums[target[new], :size] = sums[new]
        job.sums[target[~new], :size] += sums[~new]


def _status_replies(job: SwitchJob, duplicates: np.ndarray, rows: np.ndarray, rank: np.ndarray, adds: np.ndarray,
                    position: np.ndarray, first: np.ndarray, group: np.ndarray, order: np.ndarray, now: float,
                    outbox: Outbox) -> None:
    """A duplicate of a block open for STATUS_AFTER_S gets who contributed so far (rare: a loop is fine)."""
    for i in duplicates[now - job.started[rows[duplicates]] >= STATUS_AFTER_S].tolist():
        row = rows[i]
        seen = job.seen[row].copy()
        count = int(job.count[row])
        start = int(np.flatnonzero(first)[group[i]])
        for j in range(start, i):  # the row's own additions before this packet
            if adds[j]:
                seen[rank[j] >> 6] |= _U64(1) << _U64(rank[j] & 63)
                count += 1
        slot, version = divmod(int(row), 2)
        prologue = 0 if (int(job.keys[row]) >> 31) & 1 else p.PROLOGUE
        status = p.pack(p.STATUS, job.job_id, int(job.keys[row]) >> 32, int(job.keys[row]) & 0x7FFFFFFF, slot,
                        p.SWITCH_RANK, job.world, version | prologue, contributors=count,
                        values=seen.view("<u4")[:(job.world + 31) // 32].view("<i4"))
        job.counters["tx"] += 1
        outbox.add_bytes(int(order[i]), status, [int(job.member_dests[rank[i]])])


def _old(job: SwitchJob, late: np.ndarray, h: np.ndarray, keys: np.ndarray, order: np.ndarray,
         completed: np.ndarray, outbox: Outbox) -> None:
    """Packets for blocks older than their rows hold: served from the history if it still holds them after the
    completions this segment makes before them (`completed`: their packets' order; called before the segment's
    results enter the history, so what they push out is still there to copy), else answered OLD."""
    job.counters["old"] += len(late)
    completed = np.sort(completed)
    for i in late.tolist():
        later = int(np.searchsorted(completed, order[i]))
        stored = job.history.lookup(int(keys[i]), later)
        if stored is None:
            reply = p.pack(p.RESULT, job.job_id, int(h["op"][i]), int(h["offset"][i]), int(h["slot"][i]),
                           p.SWITCH_RANK, job.world, (int(h["flags"][i]) & (p.VERSION | p.PROLOGUE)) | p.OLD)
        else:
            reply = bytes(stored[:p.HEADER_BYTES + 4 * int(stored[24:26].view("<u2")[0])])
        job.counters["tx"] += 1
        outbox.add_bytes(int(order[i]), p.with_flags(reply, p.SERVED), [int(job.member_dests[int(h["rank"][i])])])
