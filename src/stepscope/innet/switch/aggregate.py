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

Sums add the j-th contribution of every row at once (whole blocks gathered and added; a row has at most `world`
contributions), in int32 with wrap-around like the switch's ALU: addition modulo 2^32 is associative, so the
order does not change the result. A row that sees two different blocks within one batch (a stale retransmission
among fresh packets) cannot be resolved that way: the batch is cut before such a packet into segments applied
one after the other. Completions go into the history and the outbox in the order of the packets that caused
them, so even which late packet still finds its result in the history is what a packet-at-a-time switch would
decide.
"""

from __future__ import annotations

import numpy as np

from stepscope.innet.switch.job import STATUS_AFTER_S, SwitchJob
from stepscope.innet.switch.outbox import Outbox
from stepscope.innet.wire import protocol as p

_U64 = np.uint64
FIELDS = ("rank", "slot", "flags", "count", "contributors", "exponent", "next_exponent", "op_flags", "op", "offset")
"""The header fields a contribution needs, as separate arrays (plain arrays index far faster than records)."""
Packets = dict[str, np.ndarray]


def contribute(job: SwitchJob, h: np.ndarray, order: np.ndarray, buffer: np.ndarray, offsets: np.ndarray,
               sources: np.ndarray, now: float, outbox: Outbox) -> None:
    """Apply the DATA packets `h` (headers, in arrival order; their datagrams at byte `offsets` of `buffer`, sent
    from `sources`) of `job`'s ranks; `order` tags each packet's answers in `outbox`."""
    counters = job.counters
    counters["rx"] += len(h)
    job.last_active = now
    rank = h["rank"].astype(np.int64)
    count, flags = h["count"], h["flags"]
    fits = ((job.member_keys[rank] == sources) & (h["slot"] < job.slots) & (count <= job.k)
            & ((count == 0) == ((flags & p.PROLOGUE) != 0)) & (h["contributors"] <= job.world)
            & (h["offset"] <= p.MAX_OFFSET))
    if not fits.all():
        counters["bad"] += int(np.count_nonzero(~fits))
        keep = np.flatnonzero(fits)
        h, order, offsets = p.take_headers(h, keep), order[keep], offsets[keep]
    counters["re"] += int(np.count_nonzero(h["flags"] & p.RETRANSMIT))
    rows = 2 * h["slot"].astype(np.int64) + (h["flags"] & p.VERSION)
    data = (h["flags"] & p.PROLOGUE) == 0
    keys = ((h["op"].astype(_U64) << _U64(32)) | (data.astype(_U64) << _U64(31))
            | h["offset"].astype(_U64))  # `protocol.block_key`: op, prologue before data, offset
    while len(rows):  # usually once: the whole batch is one segment
        by_row, end = one_key_per_row(rows, keys)
        piece = by_row[by_row < end] if end < len(rows) else by_row
        _segment(job, _packets(p.take_headers(h, piece), rows[piece], keys[piece], order[piece], offsets[piece]),
                 buffer, now, outbox)
        h, rows, keys, order, offsets = h[end:], rows[end:], keys[end:], order[end:], offsets[end:]
        if len(rows):
            outbox.freeze()  # the next piece may reuse rows whose results this one queued


def _packets(h: np.ndarray, rows: np.ndarray, keys: np.ndarray, order: np.ndarray, offsets: np.ndarray) -> Packets:
    """The columns a segment works with (views of the gathered headers, no copies)."""
    pk: Packets = {name: h[name] for name in FIELDS}
    pk["rank"] = pk["rank"].astype(np.int64)
    pk.update(rows=rows, keys=keys, order=order, offsets=offsets)
    return pk


def _take(pk: Packets, index: np.ndarray | slice) -> Packets:
    return {name: column[index] for name, column in pk.items()}


def one_key_per_row(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """The packets' order grouped by row (stable), and how many leading packets form a segment: within it every
    row sees a single block key (a later packet that brings a second key to a row starts the next segment)."""
    by_row = np.argsort(rows, kind="stable")
    sorted_rows, sorted_keys = rows[by_row], keys[by_row]
    first = np.ones(len(rows), bool)
    first[1:] = sorted_rows[1:] != sorted_rows[:-1]
    clash = by_row[sorted_keys != sorted_keys[first][np.cumsum(first) - 1]]
    return by_row, len(rows) if not len(clash) else int(clash.min())


def _segment(job: SwitchJob, pk: Packets, buffer: np.ndarray, now: float, outbox: Outbox) -> None:
    """One segment's packets, grouped by row in arrival order."""
    counters = job.counters
    rows, keys, order, rank = pk["rows"], pk["keys"], pk["order"], pk["rank"]
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
    if fresh.any():  # in the order their first packets arrived: timers of equal deadlines fire in start order
        starts = np.flatnonzero(first)[fresh]
        by_arrival = np.argsort(order[starts], kind="stable")
        _start_blocks(job, row[fresh][by_arrival], _take(pk, starts[by_arrival]), key[fresh][by_arrival], now)

    # the open blocks: who adds, who is a duplicate, who disagrees, where each block completes
    mine = adding[group]
    word, bit = rank >> 6, _U64(1) << (rank & 63).astype(_U64)
    agrees = ((pk["count"] == job.n[rows]) & (pk["exponent"] == job.exponent[rows])
              & (pk["op_flags"] == job.op_flags[rows]) & mine)
    counted_before = (job.seen[rows, word] & bit) != 0
    position = np.arange(len(rows))
    who = group * job.world + rank
    candidates = np.flatnonzero(agrees & ~counted_before)
    by_who = candidates[np.argsort(who[candidates], kind="stable")]
    first_of_rank = np.ones(len(by_who), bool)
    first_of_rank[1:] = who[by_who][1:] != who[by_who][:-1]
    adds = np.zeros(len(rows), bool)
    adds[by_who[first_of_rank]] = True  # a rank's first agreeing packet (arrival order within the row)
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
    _status_replies(job, np.flatnonzero(duplicate), rows, rank, adds, first, group, order, now, outbox)
    _add(job, pk, word, bit, adds, fresh[group], buffer)

    # completions, in the order of the packets that completed them
    completing = position[reaches & (position == done_at[group])]
    completing = completing[np.argsort(order[completing], kind="stable")]
    flags = np.where(tally[completing] >= job.world, 0,
                     np.where((job.op_flags[rows[completing]] & p.PREEMPTIVE) != 0, p.K_REACHED, p.TIMEOUT))
    _old(job, np.flatnonzero(older[group]), pk, order[completing], outbox)
    job.complete_rows(rows[completing], flags, order[completing], outbox)

    # packets that find their block complete get its result again: dup if their rank is in it, else old
    served = after | (used & (key == held) & complete)[group]
    if served.any():
        in_result = (job.seen[rows, word] & bit) != 0
        counters["dup"] += int(np.count_nonzero(served & in_result))
        counters["old"] += int(np.count_nonzero(served & ~in_result))
        job.serve(rows[served], job.member_dests[rank[served]], order[served], outbox)


def _where_added(who: np.ndarray, adds: np.ndarray) -> np.ndarray:
    """For each packet, the position of the packet that added its rank to its row (len: none did)."""
    added = np.flatnonzero(adds)
    if not len(added):
        return np.full(len(who), len(who))
    by_who = np.argsort(who[added])
    known = who[added][by_who]
    at = np.minimum(np.searchsorted(known, who), len(known) - 1)
    return np.where(known[at] == who, added[by_who][at], len(who))


def _start_blocks(job: SwitchJob, rows: np.ndarray, firsts: Packets, keys: np.ndarray, now: float) -> None:
    """The rows take new blocks, described by their first packets (which `_add` counts)."""
    job.used[rows], job.keys[rows], job.complete[rows] = True, keys, False
    job.seen[rows] = 0
    job.count[rows] = 0
    contributors = firsts["contributors"].astype(np.int64)
    job.min_count[rows] = np.where(contributors > 0, contributors, job.world)
    job.n[rows], job.exponent[rows], job.op_flags[rows] = firsts["count"], firsts["exponent"], firsts["op_flags"]
    job.next_exponent[rows] = p.NO_EXPONENT
    job.start_timers(rows, now)


def _add(job: SwitchJob, pk: Packets, word: np.ndarray, bit: np.ndarray, adds: np.ndarray, fresh: np.ndarray,
         buffer: np.ndarray) -> None:
    """Count the adding packets and add their values into their rows' sums (fresh rows: replace)."""
    rows, offsets = pk["rows"], pk["offsets"]
    r = rows[adds]
    if not len(r):
        return
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])  # rows are sorted: each row's adds are one run
    target = r[starts]
    job.count[target] += np.diff(np.append(starts, len(r)))
    exponents = np.maximum.reduceat(pk["next_exponent"][adds], starts)
    job.next_exponent[target] = np.maximum(job.next_exponent[target], exponents)
    if job.seen.shape[1] == 1:  # up to 64 ranks: one word per row
        job.seen[target, 0] |= np.bitwise_or.reduceat(bit[adds], starts)
    else:
        np.bitwise_or.at(job.seen, (r, word[adds]), bit[adds])
    n = job.n[rows]
    for size in np.unique(n[adds & (n > 0)]).tolist():
        pick = np.flatnonzero(adds & (n == size))  # row-sorted: each row's packets are one run
        starts = np.flatnonzero(np.r_[True, rows[pick][1:] != rows[pick][:-1]])
        runs = np.diff(np.append(starts, len(pick)))
        payload = offsets[pick] + p.HEADER_BYTES
        values = np.lib.stride_tricks.sliding_window_view(buffer, 4 * size)  # every datagram's values, in place
        # the j-th contribution of every row at a time: gathers and adds of whole blocks (np.add.reduceat and
        # np.add.at along rows are ten times slower here)
        sums = values[payload[starts]].view("<i4")
        for j in range(1, int(runs.max())):
            more = np.flatnonzero(runs > j)
            if len(more) == len(runs):
                sums += values[payload[starts + j]].view("<i4")
            else:
                sums[more] += values[payload[starts[more] + j]].view("<i4")
        target, new = rows[pick][starts], fresh[pick][starts]
        if new.all():
            job.sums[target, :size] = sums
        else:
            job.sums[target[new], :size] = sums[new]
            job.sums[target[~new], :size] += sums[~new]


def _status_replies(job: SwitchJob, duplicates: np.ndarray, rows: np.ndarray, rank: np.ndarray, adds: np.ndarray,
                    first: np.ndarray, group: np.ndarray, order: np.ndarray, now: float, outbox: Outbox) -> None:
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


def _old(job: SwitchJob, late: np.ndarray, pk: Packets, completed: np.ndarray, outbox: Outbox) -> None:
    """Packets for blocks older than their rows hold: served from the history if it still holds them after the
    completions this segment makes before them (`completed`: their packets' order; called before the segment's
    results enter the history, so what they push out is still there to copy), else answered OLD."""
    job.counters["old"] += len(late)
    order, keys = pk["order"], pk["keys"]
    completed = np.sort(completed)
    for i in late.tolist():
        later = int(np.searchsorted(completed, order[i]))
        stored = job.history.lookup(int(keys[i]), later)
        if stored is None:
            reply = p.pack(p.RESULT, job.job_id, int(pk["op"][i]), int(pk["offset"][i]), int(pk["slot"][i]),
                           p.SWITCH_RANK, job.world, (int(pk["flags"][i]) & (p.VERSION | p.PROLOGUE)) | p.OLD)
        else:
            reply = bytes(stored[:p.HEADER_BYTES + 4 * int(stored[24:26].view("<u2")[0])])
        job.counters["tx"] += 1
        outbox.add_bytes(int(order[i]), p.with_flags(reply, p.SERVED), [int(job.member_dests[int(pk["rank"][i])])])
