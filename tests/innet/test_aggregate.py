"""The switch against a per-packet switch written from the protocol definition (`switch_reference.ReferenceJob`),
on both data paths (numpy: a batch at once; C: packet by packet): the same packets, fed one at a time to the
reference and in batches of random size to the switch, must give the same datagrams to the same addresses in the
same order, and the same counters. Exact integers: int32 sums with wrap-around, counters, bitmaps, flags."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.wire import protocol as p
from tests.innet.switch_reference import ReferenceJob

ADDRESSES = [("127.0.0.1", 41000 + r) for r in range(8)]
STRANGER = ("127.0.0.1", 49999)
JOB = 9


def data(rank, world, values, *, op=1, offset=0, slot=0, flags=0, k=0, exponent=0, next_exponent=0, op_flags=0):
    return p.pack(p.DATA, JOB, op, offset, slot, rank, world, flags, contributors=k, exponent=exponent,
                  next_exponent=next_exponent, op_flags=op_flags, values=np.asarray(values, dtype=np.int32))


def joined_switch(world, k, slots, sto_ticks=16, history=8, data_path=None):
    switch = Switch(SwitchConfig(port=0), data_path=data_path)
    params = p.JoinParams(k, slots, sto_ticks, history)
    for rank in range(world):
        [(reply, _)] = switch.handle(p.pack(p.JOIN, JOB, 0, 0, 0, rank, world, 0, values=params.to_values()),
                                     ADDRESSES[rank], 0.0)
        assert p.unpack(reply).flags & p.BAD == 0
    reference = ReferenceJob(JOB, world, k, slots, sto_ticks * p.TICK_S, history, ADDRESSES[:world])
    return switch, reference


def test_one_batch_mixing_slots_completes_several_blocks_at_once_with_hand_computed_sums(data_path):
    switch, _ = joined_switch(world=2, k=3, slots=4, data_path=data_path)
    batch = [(data(0, 2, [1, 2, 3], slot=0, offset=0), ADDRESSES[0]),
             (data(0, 2, [10, 20, 30], slot=1, offset=3), ADDRESSES[0]),
             (data(1, 2, [100, 200, 300], slot=1, offset=3), ADDRESSES[1]),    # completes slot 1 first
             (data(1, 2, [-1, -2, 2**31 - 1], slot=0, offset=0), ADDRESSES[1]),  # completes slot 0: wraps
             (data(0, 2, [7, 7, 7], slot=2, offset=6), ADDRESSES[0]),          # slot 2 stays open
             (data(1, 2, [100, 200, 300], slot=1, offset=3, flags=p.RETRANSMIT), ADDRESSES[1])]  # served again
    sends = switch.handle_batch(batch, 0.0, gap=1)  # datagrams at odd offsets, as a GRO train may leave them
    decoded = [(p.unpack(d), p.values_of(d, p.unpack(d).count).tolist(), to) for d, to in sends]
    assert [(h.offset, values, to) for h, values, to in decoded] == [
        (3, [110, 220, 330], ADDRESSES[:2]), (0, [0, 0, -(2**31) + 2], ADDRESSES[:2]), (3, [110, 220, 330],
                                                                                        [ADDRESSES[1]])]
    assert [h.flags & p.SERVED for h, _, _ in decoded] == [0, 0, p.SERVED]
    counters = switch.jobs[JOB].counters
    assert (counters["ok"], counters["dup"], counters["re"], counters["rx"], counters["tx"]) == (2, 1, 1, 6, 5)


def test_a_stale_packet_among_fresh_ones_is_answered_as_if_packets_came_one_by_one(data_path):
    """Slot 0 completes op 1, then takes op 3 (version 0 again) in the same batch, and a late copy of op 1's
    packet after that must find op 1's result in the history; the batch is cut in pieces to decide it (numpy),
    and op 1's multicast, not sent yet when op 3 takes the row, keeps op 1's values (C: a copy)."""
    switch, reference = joined_switch(world=2, k=2, slots=1, history=4, data_path=data_path)
    batch = [(data(0, 2, [1, 1], op=1), ADDRESSES[0]), (data(1, 2, [2, 2], op=1), ADDRESSES[1]),
             (data(0, 2, [3, 3], op=2, flags=p.VERSION), ADDRESSES[0]),
             (data(1, 2, [4, 4], op=2, flags=p.VERSION), ADDRESSES[1]),
             (data(0, 2, [5, 5], op=3), ADDRESSES[0]), (data(1, 2, [1, 1], op=1, flags=p.RETRANSMIT), ADDRESSES[1]),
             (data(1, 2, [6, 6], op=3), ADDRESSES[1])]
    expected = [send for packet, source in batch for send in reference.packet(packet, source, 0.0)]
    assert switch.handle_batch(batch, 0.0) == expected
    assert switch.jobs[JOB].counters == reference.counters | {"sy": 0}
    late = [h for h in (p.unpack(d) for d, _ in expected) if h.flags & p.SERVED]
    assert [(h.op, h.contributors) for h in late] == [(1, 2)]


def test_a_late_packet_misses_a_result_that_a_completion_earlier_in_its_batch_pushed_out_of_the_history(data_path):
    switch, reference = joined_switch(world=2, k=1, slots=2, history=2, data_path=data_path)
    both = lambda op, slot, flags=0: [(data(r, 2, [op], op=op, slot=slot, flags=flags), ADDRESSES[r])  # noqa: E731
                                      for r in range(2)]
    late = (data(1, 2, [1], op=1, flags=p.RETRANSMIT), ADDRESSES[1])
    batches = [both(1, 0), both(5, 0),  # row 0: op 1, then op 5; the history holds ops 1 and 5
               [late, *both(3, 0, p.VERSION)],  # the copy comes before op 3 completes: op 1 is still there
               both(7, 0, p.VERSION)[:1] + [late] + both(7, 0, p.VERSION)[1:]]  # (op 7 on slot 0 v1 after op 3)
    answers = []
    for batch in batches:
        expected = [send for packet, source in batch for send in reference.packet(packet, source, 0.0)]
        assert switch.handle_batch(batch, 0.0) == expected
        answers += [p.unpack(d) for d, _ in expected if p.unpack(d).flags & p.SERVED]
    assert [(h.op, h.flags & p.OLD) for h in answers] == [(1, 0), (1, p.OLD)]
    switch, reference = joined_switch(world=2, k=1, slots=2, history=2, data_path=data_path)
    for batch in [both(1, 0), both(5, 0), [*both(3, 0, p.VERSION), late]]:  # op 3 completes first: op 1 is gone
        expected = [send for packet, source in batch for send in reference.packet(packet, source, 0.0)]
        assert switch.handle_batch(batch, 0.0) == expected
    assert p.unpack(expected[-1][0]).flags & p.OLD


def test_timers_fire_in_deadline_order_then_start_order(data_path):
    switch, reference = joined_switch(world=3, k=1, slots=4, data_path=data_path)
    # slot 1 starts first, then slots 3 and 0 in one batch (3's first packet first), then slot 2
    starts = [(1e-4, [1]), (2e-4, [3, 0]), (3e-4, [2])]
    for now, slots in starts:
        batch = [(data(r, 3, [slot], slot=slot, offset=slot, k=2), ADDRESSES[r]) for slot in slots for r in range(2)]
        expected = [send for packet, source in batch for send in reference.packet(packet, source, now)]
        assert switch.handle_batch(batch, now) == expected == []  # 2 of 3: waits for the timer
    fired = switch.jobs[JOB].expire(1.0)
    assert fired == reference.expire(1.0) and [p.unpack(d).slot for d, _ in fired] == [1, 3, 0, 2]


def test_a_duplicate_gets_the_contributors_once_its_block_waited_exactly_the_status_delay(data_path):
    switch, reference = joined_switch(world=3, k=2, slots=2, data_path=data_path)
    first = (data(0, 3, [1, 2]), ADDRESSES[0])
    again = (data(0, 3, [1, 2], flags=p.RETRANSMIT), ADDRESSES[0])
    for now, batch in ((1.0, [first]), (1.0999, [again]), (1.1, [again]), (1.2, [again, again])):
        expected = [send for packet, source in batch for send in reference.packet(packet, source, now)]
        assert switch.handle_batch(batch, now) == expected
        statuses = [p.unpack(d) for d, _ in expected]
        assert len(statuses) == (0 if now < 1.1 else len(batch)), now
    status = statuses[0]
    assert (status.type, status.contributors, status.count) == (p.STATUS, 1, 1)


def _stream(rng: random.Random, world: int, k: int, slots: int, ops: int) -> list[tuple[bytes, tuple]]:
    """Packets the ranks of a job could send (float ops with their prologue, int ops, partial last blocks,
    fastest-K, preemptive), then lost, duplicated, retransmitted late, reordered, corrupted, sent by strangers."""
    packets, base = [], 0
    for op in range(1, ops + 1):
        quantized = rng.random() < 0.5
        n = rng.randint(1, 3 * k)
        blocks = -(-n // k)
        prologue = min(slots, blocks) if quantized else 0
        want = rng.choice([0, world, max(1, world - 1), 1])
        op_flags = (p.QUANTIZED if quantized else 0) | (p.PREEMPTIVE if rng.random() < 0.3 else 0)
        exponent = rng.randint(-5, 5)
        for q in range(prologue + blocks):
            index = base + q
            slot, version = index % slots, (index // slots) % 2
            is_prologue = q < prologue
            block = q if is_prologue else q - prologue
            count = 0 if is_prologue else min(k, n - block * k)
            for rank in range(world):
                values = [rng.choice([rng.randint(-9, 9), 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)])
                          for _ in range(count)]
                packets.append((data(rank, world, values, op=op, offset=block * k, slot=slot,
                                     flags=version | (p.PROLOGUE if is_prologue else 0), k=want,
                                     exponent=0 if is_prologue else exponent, next_exponent=rng.randint(-9, 9),
                                     op_flags=op_flags), ADDRESSES[rank]))
        base += prologue + blocks
    disturbed = []
    for i, (packet, source) in enumerate(packets):
        roll = rng.random()
        if roll < 0.08:
            continue  # lost
        disturbed.append((packet, source))
        if roll < 0.16:
            disturbed.append((p.with_flags(packet, p.RETRANSMIT), source))  # duplicated / retransmitted
        elif roll < 0.2 and i > 4:
            disturbed.append((p.with_flags(packets[rng.randrange(i)][0], p.RETRANSMIT), source))  # a late copy
        elif roll < 0.22:
            disturbed.append((packet[:28] + bytes([(packet[28] + 1) % 256]) + packet[29:], source))  # wrong exponent
        elif roll < 0.24:
            disturbed.append((packet, STRANGER))  # someone else sends a member's packet
    for _ in range(len(disturbed) // 6):  # reordering within a window
        i = rng.randrange(len(disturbed))
        j = min(len(disturbed) - 1, i + rng.randint(1, 3 * world))
        disturbed[i], disturbed[j] = disturbed[j], disturbed[i]
    return disturbed


@pytest.mark.parametrize("seed,world,k,slots,history,seen", [
    (1, 2, 4, 2, 8, ("to", "kr", "bad", "status")), (2, 3, 1, 1, 0, ("to", "bad")), (3, 5, 7, 4, 3, ("kr", "bad")),
    (4, 1, 3, 2, 2, ()), (5, 4, 2, 3, 16, ("to", "bad")), (6, 2, 5, 1, 1, ("bad",))])
def test_random_batches_match_the_per_packet_reference(seed, world, k, slots, history, seen, data_path):
    rng = random.Random(seed)
    switch, reference = joined_switch(world, k, slots, sto_ticks=16, history=history, data_path=data_path)
    packets = _stream(rng, world, k, slots, ops=12)
    now, start, statuses = 0.0, 0, 0
    while start < len(packets):
        size = rng.choice([1, 2, 3, 7, 16, 64])
        batch = packets[start:start + size]
        start += size
        expected = [send for packet, source in batch for send in reference.packet(packet, source, now)]
        assert switch.handle_batch(batch, now, gap=rng.choice([0, 1, 4])) == expected, (start, size)
        statuses += sum(p.unpack(d).type == p.STATUS for d, _ in expected)
        now += rng.choice([1e-5, 1e-4, 2e-3, 0.15])  # across the STO (1.05 ms) and the STATUS wait (0.1 s)
        if rng.random() < 0.5:
            assert switch.jobs[JOB].expire(now) == reference.expire(now)
    counters = switch.jobs[JOB].counters
    assert {name: counters[name] for name in reference.counters} == reference.counters
    # the run saw the cases the switch has to decide (which ones: fixed by the seed)
    decided = {**reference.counters, "status": statuses}
    assert all(decided[name] > 0 for name in ("ok", "dup", "old", "re", *seen)), str(decided)
