"""The worker's batch bookkeeping, driven by hand: the send window's timers (deadlines, backoff, Karn's rule, the
RETRANSMIT flag in the kept datagram) and the stream's handling of a batch of results (out of order, duplicated,
for packets not sent yet, for a future op, from blocks the switch no longer holds), each against values worked out
from the protocol's definition."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.op import Op
from stepscope.innet.worker.rto import RetransmitTimeout
from stepscope.innet.worker.stream import InnetError, Stream, WorkerCounters
from stepscope.innet.worker.window import SendWindow


def test_window_timers_back_off_per_packet_and_only_first_transmissions_are_sampled():
    rto = RetransmitTimeout(fixed_s=0.010, min_s=0.005, max_s=0.035, backoff=2.0)
    window = SendWindow(slots=4, values_per_packet=2, rto=rto)
    window.occupy(np.array([1, 3]), np.array([5, 7]), now=1.0)
    window.mark_built(np.array([1, 3]), np.array([40, 40]))
    assert window.in_flight == 2 and window.next_deadline() == pytest.approx(1.010)
    assert window.due(1.009).tolist() == []
    assert window.due(1.010).tolist() == [1, 3]  # both retransmitted: 20 ms next
    flags = window.rows[:, 22:24].view("<u2")[:, 0]
    assert flags.tolist() == [0, p.RETRANSMIT, 0, p.RETRANSMIT]  # in the datagrams kept for re-sending
    assert window.deadline[[1, 3]].tolist() == pytest.approx([1.030, 1.030])
    window.answer(np.array([5]), now=1.031)  # slot 1 answered after a retransmission: no round-trip sample
    assert rto.srtt is None and window.in_flight == 1
    assert window.due(1.030).tolist() == [3] and window.deadline[3] == pytest.approx(1.065)  # 40 ms capped: 35
    window.occupy(np.array([0]), np.array([8]), now=2.0)
    window.mark_built(np.array([0]), np.array([40]))
    window.answer(np.array([8, 7]), now=2.004)  # sent once: sampled (4 ms); slot 3 sent 3 times: not
    assert rto.srtt == pytest.approx(0.004) and window.in_flight == 0


def _results(op: Op, packets: list[int], *, slots: int, flags: int = 0, values: int = 2) -> np.ndarray:
    """RESULT headers for packets of `op` (its data blocks carry `values` in every element)."""
    rows = []
    for q in packets:
        prologue = q < op.prologue
        block = q if prologue else q - op.prologue
        count = 0 if prologue else min(op.k, op.n - block * op.k)
        rows.append(p.pack(p.RESULT, 1, op.op_id, block * op.k, (op.base + q) % slots, p.SWITCH_RANK, op.world,
                           (p.PROLOGUE if prologue else 0) | flags, contributors=2, next_exponent=3,
                           values=np.full(count, values, np.int32)))
    lengths = np.array([len(r) for r in rows])
    buffer = np.zeros(int(lengths.sum()) + 64, np.uint8)
    buffer[:int(lengths.sum())] = np.frombuffer(b"".join(rows), np.uint8)
    offsets = np.cumsum([0, *lengths[:-1]])
    headers, valid = p.parse_headers(buffer, offsets, lengths)
    assert valid.all()
    return headers, (buffer, offsets), rows


def test_a_batch_of_results_out_of_order_duplicated_and_for_unsent_packets():
    counters = WorkerCounters()
    stream = Stream(slots=2, rank=1, stash_limit_bytes=1 << 20, counters=counters)
    op = Op(1, np.zeros(10, np.int32), average=False, min_count=2, preemptive=False, values_per_packet=3,
            slots=2, world=2)  # 4 blocks, the last of 1 value; no prologue (int32)
    stream.admit(op, lambda stashed: None)
    ready = stream.ready(np.ones(2, bool), limit=8)
    assert [(o.op_id, q.tolist(), s.tolist()) for o, q, s in ready] == [(1, [0, 1], [0, 1])]
    # packet 2 completed without this rank (a straggler), packet 0 twice, packet 1 later
    headers, where, _ = _results(op, [2, 0, 0], slots=2)
    applied = stream.apply(headers, *where, lambda i: b"")
    assert sorted(applied.tolist()) == [0, 2] and counters.duplicate_results == 1
    assert op.array.tolist() == [2, 2, 2, 0, 0, 0, 2, 2, 2, 0] and op.remaining == 2
    # slot 0 moved on to packet 2, whose result is here: it is skipped, nothing else is ready on slot 0
    assert [(q.tolist(), s.tolist()) for _, q, s in stream.ready(np.array([True, False]), limit=8)] == []
    assert counters.skipped == 1
    headers, where, _ = _results(op, [3, 1], slots=2, values=-5)
    stream.apply(headers, *where, lambda i: b"")
    assert op.event.is_set() and op.array.tolist() == [2, 2, 2, -5, -5, -5, 2, 2, 2, -5]


def test_results_for_a_future_op_wait_and_a_result_the_switch_no_longer_holds_is_an_error():
    counters = WorkerCounters()
    stream = Stream(slots=4, rank=0, stash_limit_bytes=1 << 20, counters=counters)
    first = Op(1, np.zeros(4, np.float32), average=True, min_count=2, preemptive=False, values_per_packet=2,
               slots=4, world=2)  # 2 blocks: 2 prologue packets, then 2 data packets
    second = Op(2, np.zeros(2, np.int32), average=False, min_count=2, preemptive=False, values_per_packet=2,
                slots=4, world=2)
    stream.admit(first, lambda stashed: None)
    second.base = first.packets
    headers, where, rows = _results(second, [0], slots=4, values=7)
    stream.apply(headers, *where, lambda i: rows[i])  # op 2 not submitted here yet: kept for later
    assert counters.stashed == 1 and not second.event.is_set()
    taken = []
    stream.admit(second, taken.extend)
    assert taken == rows  # handed back when op 2 arrives
    headers, where, _ = _results(first, [0], slots=4, flags=p.OLD)
    with pytest.raises(InnetError, match="completed without rank 0 and the switch no longer holds it"):
        stream.apply(headers, *where, lambda i: b"")
    assert first.agreed.tolist() == [p.NO_EXPONENT, p.NO_EXPONENT]  # nothing of the refused batch was taken
