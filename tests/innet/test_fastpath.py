"""The C fast path (`innet._fastpath`) against the numpy path and the per-packet reference, to the bit: the
switch's state and answers after every batch of random streams (loss, duplication, late copies, reordering,
fastest-K, preemptive ops, corrupted and foreign packets), a worker's packets and results on random tensors
(extreme magnitudes, rounding ties, clipped late ranks, int32 averages), and whole all-reduces with each path on
each side. Which path runs is the environment's choice, and a missing extension leaves the numpy path."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.innet.runs.reference import check_result, reference_input
from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.wire import fastpath
from stepscope.innet.wire import protocol as p
from stepscope.innet.wire.quantize import QuantizationError
from stepscope.innet.worker.faults import FaultConfig
from stepscope.innet.worker.op import Op
from tests.innet.conftest import address, job, run_ranks
from tests.innet.test_aggregate import JOB, _stream, joined_switch

pytestmark = pytest.mark.skipif(fastpath.C is None, reason=f"the C fast path is not built: {fastpath.NOT_BUILT}")

STATE = ("used", "keys", "complete", "seen", "count", "min_count", "n", "exponent", "op_flags", "next_exponent",
         "started", "deadline", "timer_order", "expired")


def _same_state(a, b):
    """Two switch jobs hold the same rows: every array, each complete row's result datagram, the history."""
    for name in STATE:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.timers_started == b.timers_started and a.counters == b.counters
    for row in np.flatnonzero(a.complete):
        size = p.HEADER_BYTES + 4 * int(a.n[row])
        assert bytes(a.datagrams[row, :size]) == bytes(b.datagrams[row, :size]), row
    assert a.history.inserted == b.history.inserted
    held = a.history.ring_numbers >= max(0, a.history.inserted - a.history.size)
    assert np.array_equal(a.history.ring_keys[held], b.history.ring_keys[held])
    assert np.array_equal(a.history.ring_numbers[held], b.history.ring_numbers[held])
    stride = p.HEADER_BYTES + 4 * a.k
    for at in np.flatnonzero(held):
        size = p.HEADER_BYTES + 4 * int(a.history.ring[at, 24:26].view("<u2")[0])
        assert size <= stride and bytes(a.history.ring[at, :size]) == bytes(b.history.ring[at, :size])


@pytest.mark.parametrize("seed", range(12))
def test_the_c_switch_equals_the_numpy_switch_and_the_reference_after_every_batch(seed):
    rng = random.Random(100 + seed)
    world, k, slots = rng.randint(1, 6), rng.randint(1, 9), rng.randint(1, 5)
    history = rng.choice([0, 1, 3, 16])
    numpy_switch, reference = joined_switch(world, k, slots, history=history, data_path="numpy")
    c_switch, _ = joined_switch(world, k, slots, history=history, data_path="c")
    packets = _stream(rng, world, k, slots, ops=10)
    now, start = 0.0, 0
    while start < len(packets):
        batch = packets[start:start + rng.choice([1, 2, 5, 16, 64])]
        start += len(batch)
        expected = [send for packet, source in batch for send in reference.packet(packet, source, now)]
        gap = rng.choice([0, 1, 3])  # datagrams at odd offsets, as a GRO train of odd sizes leaves them
        assert c_switch.handle_batch(batch, now, gap=gap) == expected == numpy_switch.handle_batch(batch, now, gap=gap)
        _same_state(c_switch.jobs[JOB], numpy_switch.jobs[JOB])
        now += rng.choice([1e-5, 2e-3, 0.15])  # across the STO (1.05 ms) and the STATUS wait (0.1 s)
        if rng.random() < 0.5:  # the Python timers fire on the state either path left
            fired = reference.expire(now)
            assert c_switch.jobs[JOB].expire(now) == fired == numpy_switch.jobs[JOB].expire(now)
    counters = c_switch.jobs[JOB].counters
    assert {name: counters[name] for name in reference.counters} == reference.counters
    assert counters["ok"] > 0 and counters["dup"] > 0 and counters["re"] > 0
    for switch in (c_switch, numpy_switch):
        switch.sock.close()


def test_an_outbox_too_small_for_a_batch_sends_it_in_pieces_with_the_same_answers():
    rng = random.Random(7)
    world, k, slots = 3, 4, 2
    switch, reference = joined_switch(world, k, slots, history=4, data_path="c")
    # room for one packet's answers at a time: every completion or re-served result fills it
    switch.fast.entries = np.zeros((4, world + 1), np.int64)
    switch.fast.scratch = np.zeros(2 * (p.HEADER_BYTES + 4 * k) + 80, np.uint8)
    packets = _stream(rng, world, k, slots, ops=40)
    batches = range(0, len(packets), 40)
    for start in batches:
        batch = packets[start:start + 40]
        expected = [send for packet, source in batch for send in reference.packet(packet, source, 0.5)]
        assert switch.handle_batch(batch, 0.5) == expected
    counters = switch.jobs[JOB].counters
    assert counters["ok"] + counters["kr"] >= 10 and counters["dup"] > 0
    assert switch.fast.fill[2] > 3 * len(batches)  # sent in pieces (once per batch with room enough)
    switch.sock.close()


def _random_values(rng: np.random.Generator, n: int, quantized: bool) -> np.ndarray:
    if not quantized:
        values = rng.integers(-(2**31), 2**31, n).astype(np.int32)
        values[: n // 4] = rng.integers(-9, 10, n // 4)
        return values
    values = (rng.standard_normal(n) * np.exp2(rng.integers(-150, 120, n))).astype(np.float32)
    special = [0.0, -0.0, 1.5, -2.5, 2.5, 1e-45, -1e-45, 1.7e38, -1.7e38, 2.0**-126, 0.5, -0.5]
    values[rng.integers(0, n, len(special))] = special
    return values


@pytest.mark.parametrize("quantized,average,world,k,n", [
    (True, True, 2, 256, 4096 + 77), (True, False, 3, 7, 50), (True, True, 1024, 64, 640), (True, False, 1, 5, 5),
    (False, True, 3, 256, 1000), (False, False, 2, 9, 100), (False, True, 1024, 16, 33)])
def test_a_workers_packets_and_results_are_the_same_bytes_on_both_paths(quantized, average, world, k, n):
    rng = np.random.default_rng(n + world)
    values = _random_values(rng, n, quantized)
    slots = 64
    ops = {path: Op(3, values.copy(), average=average, min_count=max(1, world - 1), preemptive=True,
                    values_per_packet=k, slots=slots, world=world, data_path=path) for path in ("numpy", "c")}
    if quantized:
        assert np.array_equal(ops["c"].own_exponent, ops["numpy"].own_exponent)
        # the exponents agreed by the switch: this rank's own, larger (another rank's), or smaller (agreed
        # without it: its values are clipped), as the prologue results bring them
        agreed = ops["c"].own_exponent + rng.choice([0, 0, 3, -2], ops["c"].blocks)
        for op in ops.values():
            op.agreed[:] = agreed
    q = rng.permutation(ops["c"].packets)
    windows = {path: np.zeros((slots, p.HEADER_BYTES + 4 * k), np.uint8) for path in ops}
    for start in range(0, len(q), slots):  # a window's worth at a time, each packet on its slot's row
        part = q[start:start + slots]
        rows, versions = rng.permutation(slots)[:len(part)], rng.integers(0, 2, len(part))
        lengths = {path: ops[path].build_into(part, windows[path], rows, versions, 9, 1) for path in ops}
        assert np.array_equal(lengths["c"], lengths["numpy"])
        for row, length in zip(rows.tolist(), lengths["c"].tolist(), strict=True):
            assert bytes(windows["c"][row, :length]) == bytes(windows["numpy"][row, :length])
    assert ops["c"].clipped == ops["numpy"].clipped and (ops["c"].clipped or not quantized or world == 1)

    # results: sums of any int32, contributor counts, exponents and flags, at odd offsets of a receive buffer
    results, offsets, at = [], [], 0
    for packet in q.tolist():
        prologue = packet < ops["c"].prologue
        block = packet if prologue else packet - ops["c"].prologue
        count = 0 if prologue else min(k, n - block * k)
        flags = (p.PROLOGUE if prologue else 0) | int(rng.choice([0, p.TIMEOUT, p.K_REACHED]))
        datagram = p.pack(p.RESULT, 9, 3, block * k, packet % slots, p.SWITCH_RANK, world, flags,
                          contributors=int(rng.integers(1, world + 1)), exponent=int(rng.integers(-128, 128)),
                          next_exponent=int(rng.integers(-126, 128)), op_flags=ops["c"].op_flags,
                          values=rng.integers(-(2**31), 2**31, count).astype(np.int32))
        results.append(datagram)
        offsets.append(at)
        at += len(datagram) + int(rng.integers(0, 4))
    buffer = np.zeros(at + 64, np.uint8)
    for datagram, offset in zip(results, offsets, strict=True):
        buffer[offset:offset + len(datagram)] = np.frombuffer(datagram, np.uint8)
    offsets = np.array(offsets, np.int64)
    headers, valid = p.parse_headers(buffer, offsets, np.array([len(d) for d in results]))
    assert valid.all()
    for start in range(0, len(q), 100):
        piece = slice(start, start + 100)
        for op in ops.values():
            op.take_results(q[piece], p.take_headers(headers, np.arange(len(q))[piece]), buffer, offsets[piece])
    a, b = ops["c"], ops["numpy"]
    assert np.array_equal(a.array.view(np.int32), b.array.view(np.int32))  # bit for bit, nan and -0.0 included
    assert np.array_equal(a.agreed, b.agreed) and np.array_equal(a.contributors, b.contributors)
    assert np.array_equal(a.done, b.done) and a.done.all() and a.remaining == b.remaining == 0
    assert a.timed_out_blocks == b.timed_out_blocks > 0


@pytest.mark.parametrize("values,message", [([1.0, np.inf], "inf or nan"), ([np.nan, 0.0], "inf or nan"),
                                            ([2.0**127, 1.0], "2\\*\\*127"), ([-(2.0**127)], "2\\*\\*127")])
def test_values_that_cannot_be_quantized_are_refused_alike(values, message):
    for path in ("numpy", "c"):
        with pytest.raises(QuantizationError, match=message):
            Op(1, np.array(values, np.float32), average=True, min_count=2, preemptive=False, values_per_packet=4,
               slots=4, world=2, data_path=path)


FAULTY = FaultConfig(drop_up=0.05, drop_down=0.05, duplicate=0.01, reorder=0.01, seed=11)


@pytest.mark.parametrize("switch_path,worker_path", [("numpy", "numpy"), ("c", "numpy"), ("numpy", "c")])
def test_whole_all_reduces_are_exact_with_either_path_on_either_side(monkeypatch, switch_path, worker_path):
    """Real sockets, 5% loss both ways, duplication, reordering: int32 sums exact, float averages within the
    quantization bound and the same on every rank, fastest-K (K = 2 of 3) preemptive."""
    monkeypatch.setenv(fastpath.ENV, worker_path)
    world, numel = 3, 2000
    ints = [reference_input(4, r, numel, "int32") for r in range(world)]
    floats = [reference_input(4, r, numel, "fp32") for r in range(world)]
    with Switch(SwitchConfig(port=0), data_path=switch_path) as switch:
        assert (switch.fast is not None) == (switch_path == "c")

        def rank(r):
            member = job(switch, r, world, rto_ms=3, faults=FAULTY, slots=16)
            summed = member.all_reduce(ints[r].copy(), "sum")
            averaged = member.all_reduce(floats[r].copy(), "avg")
            quick = member.submit(floats[r].copy(), "avg", k=2, preemptive=True)
            quick.wait()
            member.close()
            return summed, averaged, quick.summary()

        results = run_ranks(world, rank, timeout_s=60)
    total = np.sum(np.stack(ints), axis=0, dtype=np.int32)
    for summed, averaged, summary in results:
        assert np.array_equal(summed, total)
        assert np.array_equal(averaged, results[0][1])
        assert check_result(averaged, floats, values_per_packet=256, average=True).wrong == 0
        assert summary["min_contributors"] >= 2


def test_the_environment_chooses_the_path_and_a_missing_extension_leaves_numpy(monkeypatch):
    monkeypatch.delenv(fastpath.ENV, raising=False)
    assert fastpath.resolve() is fastpath.C and fastpath.name(fastpath.resolve()) == "c"
    monkeypatch.setenv(fastpath.ENV, "numpy")
    assert fastpath.resolve() is None and fastpath.resolve("c") is fastpath.C
    assert fastpath.describe(None).startswith("data path numpy")
    monkeypatch.setenv(fastpath.ENV, "fast")
    with pytest.raises(UsageError, match="auto, c, numpy"):
        fastpath.resolve()
    monkeypatch.setattr(fastpath, "C", None)
    monkeypatch.setattr(fastpath, "NOT_BUILT", "No module named 'stepscope.innet._fastpath'")
    monkeypatch.setenv(fastpath.ENV, "auto")
    assert fastpath.resolve() is None and "not built" in fastpath.describe(None)
    with pytest.raises(UsageError, match="not built"):
        fastpath.resolve("c")
    with Switch(SwitchConfig(port=0)) as switch:  # the numpy path serves
        assert switch.fast is None and switch.receiver.native is None

        def rank(r):
            with job(switch, r, 2, pipes=1) as member:
                return member.all_reduce(np.full(300, r + 5, np.int32), "sum")

        assert all((x == 11).all() for x in run_ranks(2, rank))
        from stepscope.innet.switch.process import probe

        assert probe(address(switch))["fast_path"] == 0


def test_the_c_receive_loop_answers_control_packets_in_their_place_among_data():
    """A JOIN, then DATA packets with switch-counter requests among them, all queued before the switch reads: the C
    drain stops at each request, the Python handler answers it, the rest of the batch goes on; every answer comes
    back in the order of the requests, and the switch counted every datagram."""
    import socket

    switch = Switch(SwitchConfig(port=0), data_path="c")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.connect(switch.address)
    sent = [("joined", p.pack(p.JOIN, 5, 0, 0, 0, 0, 1, 0, values=p.JoinParams(2, 4, 16, 8).to_values()))]
    for i in range(300):  # world 1: every DATA packet completes its block at once
        if i % 7 == 3:
            sent.append(("stats", p.pack(p.STATS, 0, 0, 0, 0, 0, 0, 0)))
        else:
            slot, version = i % 4, (i // 4) % 2
            sent.append(("data", p.pack(p.DATA, 5, i + 1, 0, slot, 0, 1, version, values=np.array([i, -i], np.int32))))
    for _, datagram in sent:
        sock.send(datagram)
    stops = []
    drain = switch.fast.process
    switch.fast.process = lambda batch, now, collect=None, control_at=None: (  # noqa: E731
        stops.append(control_at), drain(batch, now, collect, control_at))
    with switch:  # serves from here: the whole burst is queued
        sock.settimeout(2.0)
        answers = [p.unpack(sock.recv(4096)) for _ in sent]
        kinds = {p.JOINED: "joined", p.STATS_REPLY: "stats", p.RESULT: "data"}
        assert [kinds[h.type] for h in answers] == [kind for kind, _ in sent]
        assert [h.op for h in answers if h.type == p.RESULT] == [i + 1 for i in range(300) if i % 7 != 3]
        assert switch.counters["rx"] == len(sent) and switch.counters["bad"] == 0
        assert switch.counters["internal_errors"] == 0 and switch.jobs[5].counters["ok"] == len(answers) - 44
    assert len(stops) >= 4 and max(stops) > 0  # each batch stopped at its first request, within the batch
    sock.close()


def _two_streams(rng: np.random.Generator, slots: int):
    """The same three ops (float average, int sum, float sum; n not a multiple of k) admitted to a numpy stream
    and to a C one, with the same agreed exponents."""
    from stepscope.innet.worker.stream import Stream, WorkerCounters

    streams, admitted = {}, {}
    for path in ("numpy", "c"):
        native = fastpath.resolve(path)
        stream = Stream(slots, rank=1, stash_limit_bytes=1 << 20, counters=WorkerCounters(), native=native)
        specs = [(np.float32, True, 400), (np.int32, False, 301), (np.float32, False, 20)]
        admitted[path] = []
        for op_id, (dtype, average, n) in enumerate(specs, start=1):
            values = np.random.default_rng(op_id).standard_normal(n).astype(dtype) * 100
            admitted[path].append(Op(op_id, values, average=average, min_count=2, preemptive=False,
                                     values_per_packet=8, slots=slots, world=3, data_path=path))
            stream.admit(admitted[path][-1], lambda stashed: None)
        streams[path] = stream
    return streams, admitted


def test_a_batch_of_results_is_taken_in_c_with_the_numpy_streams_decisions():
    """Results of three ops in flight, out of order, duplicated within and across batches, some with offsets that
    fit no packet or counts that do not fit the block, some completed by the timeout: the C batch path and the
    numpy path end in the same tensors, counts, slot bookkeeping and finished ops."""
    rng = np.random.default_rng(12)
    slots = 16
    streams, admitted = _two_streams(rng, slots)
    ops = admitted["c"]
    packets = [(op, q) for op in ops for q in range(op.packets)]
    left_to_numpy = 0
    for batch_number in range(12):
        chosen = [packets[i] for i in rng.integers(0, len(packets), 40)]
        datagrams = []
        for op, q in chosen:
            prologue = q < op.prologue
            block = q if prologue else q - op.prologue
            count = 0 if prologue else min(op.k, op.n - block * op.k)
            offset = block * op.k + (3 if rng.random() < 0.05 else 0)  # now and then: fits no packet
            count += int(rng.random() < 0.05)  # now and then: not the block's size
            datagrams.append(p.pack(p.RESULT, 4, op.op_id, offset, (op.base + q) % slots, p.SWITCH_RANK, 3,
                                    (p.PROLOGUE if prologue else 0) | int(rng.choice([0, p.TIMEOUT])),
                                    contributors=int(rng.integers(1, 4)), exponent=int(rng.integers(-5, 9)),
                                    next_exponent=int(rng.integers(-5, 9)),
                                    values=rng.integers(-(2**31), 2**31, count).astype(np.int32)))
        lengths = np.array([len(d) for d in datagrams])
        offsets = np.cumsum([0, *(lengths[:-1] + 1)])  # odd offsets
        buffer = np.zeros(int(offsets[-1] + lengths[-1]) + 64, np.uint8)
        for datagram, offset in zip(datagrams, offsets, strict=True):
            buffer[offset:offset + len(datagram)] = np.frombuffer(datagram, np.uint8)
        from stepscope.innet.wire.batch_io import Datagrams

        batch = Datagrams(buffer, offsets, lengths)
        assert streams["numpy"].apply_batch(batch, 4) is None  # the numpy stream has no C path
        headers, valid = p.parse_headers(buffer, offsets, lengths)
        expected = streams["numpy"].apply(headers, buffer, offsets, lambda i: b"")
        got = streams["c"].apply_batch(batch, 4)
        if got is None:  # results for an op that finished already: as the engine does, the numpy stream decides
            left_to_numpy += 1
            got = streams["c"].apply(headers, buffer, offsets, lambda i: b"")
        assert sorted(got.tolist()) == sorted(expected.tolist()), batch_number
        a, b = streams["c"], streams["numpy"]
        assert a.counters == b.counters and np.array_equal(a.slot_next, b.slot_next)
        assert sorted(a.ops) == sorted(b.ops)
    for a, b in zip(admitted["c"], admitted["numpy"], strict=True):
        assert np.array_equal(a.array.view(np.int32), b.array.view(np.int32)) and np.array_equal(a.done, b.done)
        assert np.array_equal(a.agreed, b.agreed) and np.array_equal(a.contributors, b.contributors)
        assert (a.remaining, a.timed_out_blocks) == (b.remaining, b.timed_out_blocks)
    assert streams["c"].counters.duplicate_results > 20 and streams["c"].counters.results > 100
    assert 3 not in streams["c"].ops and 3 not in streams["numpy"].ops  # finished, on both
    assert 0 < left_to_numpy < 6  # results for a finished op went to the numpy stream; most batches to C


@pytest.mark.parametrize("odd", ["old", "status", "other job", "future op"])
def test_a_batch_the_c_path_does_not_decide_is_left_to_the_numpy_stream(odd):
    rng = np.random.default_rng(3)
    stream = _two_streams(rng, 16)[0]["c"]
    op = stream.ops[1]
    usual = p.pack(p.RESULT, 4, 1, 0, op.base % 16, p.SWITCH_RANK, 3, p.PROLOGUE, contributors=3, next_exponent=2)
    other = {"old": p.pack(p.RESULT, 4, 1, 8, 1, p.SWITCH_RANK, 3, p.PROLOGUE | p.OLD),
             "status": p.pack(p.STATUS, 4, 1, 0, 0, p.SWITCH_RANK, 3, 0, values=np.array([3], np.int32)),
             "other job": p.pack(p.RESULT, 5, 1, 8, 1, p.SWITCH_RANK, 3, p.PROLOGUE),
             "future op": p.pack(p.RESULT, 4, 9, 0, 1, p.SWITCH_RANK, 3, 0)}[odd]
    datagrams = [usual, other]
    lengths = np.array([len(d) for d in datagrams])
    buffer = np.zeros(int(lengths.sum()) + 64, np.uint8)
    buffer[:int(lengths.sum())] = np.frombuffer(b"".join(datagrams), np.uint8)
    from stepscope.innet.wire.batch_io import Datagrams

    assert stream.apply_batch(Datagrams(buffer, np.array([0, len(usual)]), lengths), 4) is None
    assert not op.done.any() and stream.counters.results == 0  # nothing taken: the whole batch goes to `apply`


def test_only_the_first_copy_of_a_result_in_a_batch_counts_even_when_it_does_not_fit_its_block():
    from stepscope.innet.wire.batch_io import Datagrams

    streams, admitted = _two_streams(np.random.default_rng(4), 16)
    op = admitted["c"][1]  # int32 sum, no prologue: packet 0 is block 0 (8 values)
    right = p.pack(p.RESULT, 4, 2, 0, op.base % 16, p.SWITCH_RANK, 3, 0, contributors=3,
                   values=np.arange(8, dtype=np.int32))
    wrong = right[:24] + (7).to_bytes(2, "little") + right[26:-4]  # 7 values: not the block's size
    for datagrams, taken in (([wrong, right], 0), ([right, right], 1)):
        lengths = np.array([len(d) for d in datagrams])
        buffer = np.zeros(int(lengths.sum()) + 64, np.uint8)
        buffer[:int(lengths.sum())] = np.frombuffer(b"".join(datagrams), np.uint8)
        offsets = np.array([0, lengths[0]])
        headers, _ = p.parse_headers(buffer, offsets, lengths)
        before = streams["c"].counters.results
        got = streams["c"].apply_batch(Datagrams(buffer, offsets, lengths), 4)
        expected = streams["numpy"].apply(headers, buffer, offsets, lambda i: b"")
        assert got.tolist() == expected.tolist() and streams["c"].counters.results - before == taken
        assert streams["c"].counters == streams["numpy"].counters
