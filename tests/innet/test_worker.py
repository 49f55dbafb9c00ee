"""The all-reduce client against a real switch over loopback UDP: results under loss, duplication and
reordering; fastest-K with a stalled rank; clean errors when the switch is not there."""

import socket
import threading
import time

import numpy as np
import pytest

from stepscope import innet
from stepscope.errors import UsageError
from stepscope.innet import InnetError, InnetJob, JobConfig, log_line
from stepscope.innet.runs.reference import check_result, reference_input
from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.wire.quantize import QuantizationError
from stepscope.innet.worker.faults import FaultConfig
from tests.innet.conftest import address, job, run_ranks

FAULTY = FaultConfig(drop_up=0.05, drop_down=0.05, duplicate=0.05, reorder=0.05, seed=3)


@pytest.mark.parametrize("world,numel,senders", [(2, 1000, 0), (3, 777, 2), (4, 2049, 0)])
def test_exact_ints_and_bounded_floats_under_loss_duplication_and_reordering(switch, world, numel, senders):
    ints = [reference_input(1, r, numel, "int32") for r in range(world)]
    floats = [reference_input(1, r, numel, "fp32") for r in range(world)]

    def rank(r):
        member = job(switch, r, world, pipes=1, slots=8, rto_ms=3, faults=FAULTY,  # k = 64: numel % k != 0
                     sender_threads=senders)
        a, b, c, d = ints[r].copy(), floats[r].copy(), floats[r].copy(), ints[r].copy()
        member.all_reduce(a, "sum")
        pending = [member.submit(b, "sum"), member.submit(c, "avg"), member.submit(d, "avg")]  # in flight together
        for x in pending:
            x.wait()
        counters = member.counters
        member.close()
        return a, b, c, counters, d

    results = run_ranks(world, rank)
    total = np.sum(ints, axis=0, dtype=np.int64)
    for a, b, c, _counters, d in results:
        assert np.array_equal(a, total.astype(np.int32))
        assert np.array_equal(d, (np.sign(total) * (np.abs(total) // world)).astype(np.int32))  # C's int division
        assert check_result(d, ints, values_per_packet=64, average=True).wrong == 0
        assert check_result(b, floats, values_per_packet=64, average=False).wrong == 0
        assert check_result(c, floats, values_per_packet=64, average=True).wrong == 0
        assert np.array_equal(c, results[0][2])  # every rank holds the very same average
    injected = [r[3] for r in results]
    assert sum(c["injected_dropped_up"] + c["injected_dropped_down"] for c in injected) > 0
    assert sum(c["retransmitted"] for c in injected) > 0
    stats = switch.job_counters()[11]
    assert stats["dup"] > 0 and stats["bad"] == 0 and stats["to"] == 0


def test_default_packets_int32_wrap_and_fastest_k_under_loss(switch):
    """The default packet size (4 pipes: 256 values) under loss, duplication and reordering: an int32 sum that
    wraps around as the switch's ALU does, then fastest-K (K = 2 of 3) whose result must hold exactly the two
    ranks that contributed (the third starts only once they have their results)."""
    world, numel = 3, 1000  # 4 blocks of 256, the last one partial
    big = [np.full(numel, 2**30 + r, np.int32) for r in range(world)]  # 3 x 2**30 > 2**31 - 1
    big[1][::7] = -(2**30)  # some sums stay in range
    floats = [reference_input(2, r, numel, "fp32") for r in range(world)]
    fast_done = threading.Barrier(world)

    def rank(r):
        member = job(switch, r, world, job_id=12, rto_ms=3, faults=FAULTY, timeout_s=30)
        assert member.config.k == 256  # the default: 4 pipes of 64
        wrapped = member.all_reduce(big[r].copy(), "sum")
        if r == 2:
            fast_done.wait(timeout=60)  # the straggler: its peers already have their fastest-K result
        pending = member.submit(floats[r].copy(), "avg", k=2)
        average = pending.wait()
        summary = pending.summary()
        if r != 2:
            fast_done.wait(timeout=60)
        counters = member.counters
        member.close()
        return wrapped, average, summary, counters

    results = run_ranks(world, rank, timeout_s=120)
    expected = np.sum(np.stack(big), axis=0, dtype=np.int32)  # numpy's int32 sum wraps around too
    assert (expected < 0).any() and (expected > 0).any()  # it did wrap, and not everywhere
    for wrapped, average, _, _ in results:
        assert np.array_equal(wrapped, expected)
        assert np.array_equal(average, results[0][1])  # the straggler receives the same blocks
    for _, average, summary, _ in results[:2]:
        assert summary["min_contributors"] == 2
        # the average of ranks 0 and 1 only (divided by 2, not 3), within the quantization bound
        check = check_result(average, floats[:2], values_per_packet=256, average=True)
        assert check.wrong == 0 and check.checked == numel
        assert check_result(average, floats, values_per_packet=256, average=True).wrong > 0  # not all three
    counters = [r[3] for r in results]
    assert sum(c["injected_dropped_up"] + c["injected_dropped_down"] for c in counters) > 0
    assert sum(c["retransmitted"] for c in counters) > 0


def test_a_wrong_result_would_be_detected():
    floats = [reference_input(1, r, 300, "fp32") for r in range(2)]
    good = (floats[0].astype(np.float64) + floats[1]).astype(np.float32)
    assert check_result(good, floats, values_per_packet=64, average=False).wrong == 0
    bad = good.copy()
    bad[5] += 1e-3
    assert check_result(bad, floats, values_per_packet=64, average=False).wrong == 1


def test_fastest_k_finishes_without_the_stalled_rank_and_averages_the_real_count(switch):
    world, numel, sto_ms = 3, 500, 20.0
    inputs = [np.full(numel, float(r + 1), np.float32) for r in range(world)]
    fast_done = threading.Barrier(world)  # the straggler starts only after ranks 0 and 1 have their results

    def rank(r):
        # 500 values, k = 256: 2 prologue + 2 data blocks, all in flight at once (slots 8): one STO each round
        member = job(switch, r, world, pipes=4, slots=8, sto_ms=sto_ms, timeout_s=20)
        if r == 2:
            fast_done.wait(timeout=25)  # the straggler: had the others waited for it, this would time out
        pending = member.submit(inputs[r].copy(), "avg", k=2)
        result = pending.wait()
        summary = pending.summary()
        if r != 2:
            fast_done.wait(timeout=25)
        member.close()
        return result, summary

    results = run_ranks(world, rank, timeout_s=60)
    for r in (0, 1):
        result, summary = results[r]
        # finished while rank 2 had not submitted at all: the barrier orders it, no clock is involved
        assert summary["min_contributors"] == 2 and summary["timed_out_blocks"] == 4
        assert np.allclose(result, 1.5, atol=1e-6)  # (1 + 2) / 2, not (1 + 2 + 0) / 3
    # the straggler receives the same average, from results already there: its peers are past the barrier and
    # never send for this op again, so waiting on them would have failed after timeout_s instead
    assert np.array_equal(results[2][0], results[0][0])


def test_a_refused_port_fails_at_once():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens
    start = time.monotonic()
    with pytest.raises(InnetError, match="refused the job"):  # the refusal itself, not the connect timeout
        InnetJob(JobConfig(switch=f"127.0.0.1:{port}", connect_timeout_s=20)).join()
    assert time.monotonic() - start < 10  # far below the 20 s a client ignoring the refusal would wait


def test_a_silent_switch_fails_within_the_connect_timeout():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        start = time.monotonic()
        with pytest.raises(InnetError, match="did not answer within 1 s"):
            InnetJob(JobConfig(switch=f"127.0.0.1:{black_hole.getsockname()[1]}", connect_timeout_s=1)).join()
        assert 1 <= time.monotonic() - start < 30  # waited the timeout, then stopped (a hang guard, not a timing)


def test_a_switch_that_dies_mid_job_fails_the_op_within_the_timeout():
    switch = Switch(SwitchConfig(port=0)).start()
    member = InnetJob(JobConfig(switch=address(switch), world=2, rank=0, timeout_s=1.0), log=lambda _: None)
    member.join(wait_all=False)
    switch.stop()  # rank 1 never comes, and now the switch is gone too
    start = time.monotonic()
    with pytest.raises(InnetError, match="refused|did not answer|no all-reduce progress"):
        member.all_reduce(np.ones(1000, np.float32))
    assert time.monotonic() - start < 20  # a hang guard: the 1 s progress timeout, with room for a loaded machine
    member.close()


def test_closing_a_job_fails_its_ops_in_flight_at_once(switch):
    member = InnetJob(JobConfig(switch=address(switch), world=2, rank=0, timeout_s=30), log=lambda _: None)
    member.join(wait_all=False)
    pending = member.submit(np.ones(100, np.float32))  # rank 1 never comes: it cannot complete
    member.close()
    with pytest.raises(InnetError, match="closed before this all-reduce finished"):
        pending.wait(timeout_s=5)  # fails now, not after the op's 30 s progress timeout


def test_a_job_pausing_between_all_reduces_is_kept_alive(monkeypatch):
    from stepscope.innet.worker import engine as worker_engine

    monkeypatch.setattr(worker_engine, "KEEPALIVE_S", 0.1)
    with Switch(SwitchConfig(port=0, idle_s=0.5)) as short_memory:  # forgets a job silent for 0.5 s

        def rank(r):
            with job(short_memory, r, 2, job_id=41, timeout_s=5) as member:
                member.all_reduce(np.ones(10, np.int32), "sum")
                time.sleep(1.6)  # a pause (evaluation, checkpoint) longer than idle_s + the 1 s idle scan
                return member.all_reduce(np.ones(10, np.int32), "sum")

        assert all((x == 2).all() for x in run_ranks(2, rank))
        assert short_memory.counters["jobs_expired"] == 0


def test_bad_requests_are_usage_errors(switch):
    member = job(switch, 0, 1)
    with pytest.raises(UsageError):
        member.all_reduce(np.ones(4, np.float64))
    with pytest.raises(UsageError):
        member.all_reduce(np.ones(4, np.int32), "max")
    with pytest.raises(UsageError):
        member.all_reduce(np.ones(4, np.float32), k=2)
    assert member.all_reduce(np.ones(4, np.float32), "sum").tolist() == [1.0] * 4  # world 1 works
    # a buffer still being reduced cannot be reduced again
    buffer = np.ones(1 << 20, np.float32)  # thousands of packets: still in flight when the second comes
    first = member.submit(buffer, "sum")
    if not first.op.event.is_set():
        with pytest.raises(UsageError, match="shares memory"):
            member.submit(buffer[10:20], "sum")
    first.wait()
    member.close()
    # an op refused on one rank only (values that cannot be quantized) spends its id as on the other ranks, and
    # every later op on that rank fails at once: none pairs with another op's id
    member = job(switch, 0, 1, job_id=12)
    with pytest.raises(QuantizationError):
        member.all_reduce(np.full(4, np.inf, np.float32))
    with pytest.raises(InnetError, match="op 1 was refused on rank 0"):
        member.all_reduce(np.ones(4, np.float32), "sum")
    member.close()
    with pytest.raises(UsageError):
        JobConfig(switch="nohost").validate()
    for bad in ({"job_id": 0}, {"sto_ms": float("inf")}, {"sto_ticks": 2**32}):
        with pytest.raises(UsageError):
            JobConfig(switch="127.0.0.1:9", **bad).validate()


def test_log_line_has_the_dpa_format():
    array = np.zeros(7087872, np.float32)
    line = log_line(1120, array, 4, True, 4, 4)
    address_ = f"0x{array.ctypes.data:x}"
    assert line == (f"innet: new-task allreduce.1120 [7087872 x f32] {address_} > {address_} "
                    "4-pipe average quant.1 no-straggle")
    assert log_line(3, np.zeros(5, np.int32), 1, False, 3, 4).endswith("1-pipe sum quant.0 straggle-3")


def test_module_level_all_reduce_on_an_initialized_job(switch):
    with pytest.raises(InnetError, match="init"):
        innet.all_reduce(np.ones(3, np.float32))

    def rank(r):
        job_ = InnetJob(JobConfig(switch=address(switch), job_id=31, rank=r, world=2), log=lambda _: None).join()
        try:
            return job_.all_reduce(np.full(300, r, np.float32), "avg", k=None)
        finally:
            job_.close()

    innet.init(address(switch), rank=0, world=1, job_id=30)  # the default job (world 1 here)
    try:
        assert innet.all_reduce(np.full(5, 2.0, np.float32), op="sum").tolist() == [2.0] * 5
    finally:
        innet.shutdown()
    assert all(np.allclose(x, 0.5) for x in run_ranks(2, rank))


@pytest.mark.parametrize("faults", [FaultConfig(drop_up=0.05, drop_down=0.05, duplicate=0.01, reorder=0.01, seed=9),
                                    FaultConfig()])
def test_a_sharded_switch_serves_each_slot_on_its_shard_exactly_under_loss(faults):
    """Two shards (slot j on shard j mod 2), three ranks, with and without loss, duplication and reordering:
    exact int32 sums, every block on the shard its slot names, and the switch counts the retransmissions."""
    world, numel = 3, 3000
    ints = [reference_input(4, r, numel, "int32") for r in range(world)]
    shards = [Switch(SwitchConfig(port=0)).start() for _ in range(2)]
    addresses = ",".join(address(shard) for shard in shards)
    try:
        def rank(r):
            config = JobConfig(switch=addresses, job_id=21, rank=r, world=world, pipes=1, slots=6, rto_ms=3,
                               faults=faults, timeout_s=10)
            with InnetJob(config, log=lambda _: None) as member:
                result = member.all_reduce(ints[r].copy(), "sum")
                return result, member.counters, member.stats()

        results = run_ranks(world, rank)
    finally:
        for shard in shards:
            shard.stop()
    total = np.sum(ints, axis=0, dtype=np.int64).astype(np.int32)
    assert all(np.array_equal(result, total) for result, _, _ in results)
    blocks = -(-numel // 64)  # 47 blocks in stream packets 0..46: slots 0..5 alternate between the shards
    per_shard = [shard.job_counters()[21]["ok"] for shard in shards]
    assert per_shard == [sum(1 for i in range(blocks) if i % 6 % 2 == s) for s in (0, 1)]
    assert results[0][2]["ok"] == blocks  # the job's counters, summed over the shards
    retransmitted = sum(c["retransmitted"] - c["injected_dropped_up"] for _, c, _ in results)
    assert sum(shard.job_counters()[21]["re"] for shard in shards) >= retransmitted
    assert retransmitted > 0 or not faults.network
