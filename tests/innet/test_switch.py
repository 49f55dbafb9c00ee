"""The switch's state machine (driven packet by packet with chosen times) and its robustness over real UDP."""

import random
import socket
import time

import numpy as np

from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.wire import protocol as p

ADDRESSES = [("127.0.0.1", 40000 + r) for r in range(8)]


def make_switch(world, job=5, sto_ticks=16, k=4, slots=2, history=8, **config):
    switch = Switch(SwitchConfig(port=0, **config))  # a port the OS picks
    params = p.JoinParams(k, slots, sto_ticks, history)
    for rank in range(world):
        reply = switch.handle(p.pack(p.JOIN, job, 0, 0, 0, rank, world, 0, values=params.to_values()),
                              ADDRESSES[rank], 0.0)
        assert p.unpack(reply[0][0]).flags & p.BAD == 0
    return switch


def data(rank, world, values, *, job=5, op=1, offset=0, slot=0, flags=0, k=0, exponent=0, next_exponent=0):
    return p.pack(p.DATA, job, op, offset, slot, rank, world, flags, contributors=k, exponent=exponent,
                  next_exponent=next_exponent, values=np.asarray(values, dtype=np.int32))


def results(sends):
    return [(p.unpack(packet), p.values_of(packet, p.unpack(packet).count).tolist(), receivers)
            for packet, receivers in sends]


def test_a_block_completes_when_every_rank_contributed_and_is_multicast():
    switch = make_switch(3)
    assert switch.handle(data(0, 3, [1, 2, 3, 4], next_exponent=3), ADDRESSES[0], 0.0) == []
    assert switch.handle(data(1, 3, [10, 20, 30, 40], next_exponent=7), ADDRESSES[1], 0.0) == []
    [(h, values, receivers)] = results(switch.handle(data(2, 3, [100, 200, 300, 400]), ADDRESSES[2], 0.0))
    assert h.type == p.RESULT and values == [111, 222, 333, 444] and h.contributors == 3
    assert h.next_exponent == 7 and receivers == ADDRESSES[:3]  # the max of the announced exponents
    # a retransmission after completion gets the stored result back (unicast), counted as a duplicate
    [(h, values, receivers)] = results(switch.handle(data(1, 3, [10, 20, 30, 40], flags=p.RETRANSMIT),
                                                     ADDRESSES[1], 0.1))
    assert values == [111, 222, 333, 444] and receivers == [ADDRESSES[1]] and h.flags & p.SERVED
    counters = switch.jobs[5].counters
    assert (counters["ok"], counters["dup"], counters["re"], counters["to"]) == (1, 1, 1, 0)


def test_a_duplicate_before_completion_is_not_added_twice():
    switch = make_switch(2)
    switch.handle(data(0, 2, [5, 5, 5, 5]), ADDRESSES[0], 0.0)
    switch.handle(data(0, 2, [5, 5, 5, 5]), ADDRESSES[0], 0.0)
    [(_, values, _)] = results(switch.handle(data(1, 2, [1, 1, 1, 1]), ADDRESSES[1], 0.0))
    assert values == [6, 6, 6, 6] and switch.jobs[5].counters["dup"] == 1


def test_fastest_k_completes_at_the_timeout_with_the_real_count():
    switch = make_switch(4, sto_ticks=16)
    sto = 16 * p.TICK_S
    for rank in range(3):
        switch.handle(data(rank, 4, [rank + 1] * 4, k=3), ADDRESSES[rank], 0.0)
    job = switch.jobs[5]
    assert job.expire(sto * 0.99) == []  # the timer has not fired yet
    [(h, values, receivers)] = results(job.expire(sto))
    assert values == [6, 6, 6, 6] and h.contributors == 3 and h.flags & p.TIMEOUT and len(receivers) == 4
    # the straggler's late contribution is not added; it gets the result, counted as old
    [(h, values, _)] = results(switch.handle(data(3, 4, [100] * 4, k=3), ADDRESSES[3], 2 * sto))
    assert values == [6, 6, 6, 6] and job.counters["old"] == 1 and job.counters["to"] == 1


def test_k_equal_world_never_completes_by_timeout_and_preemptive_completes_at_k():
    switch = make_switch(3)
    switch.handle(data(0, 3, [1] * 4), ADDRESSES[0], 0.0)
    switch.handle(data(1, 3, [1] * 4), ADDRESSES[1], 0.0)
    assert switch.jobs[5].expire(1.0) == []  # K = world: no tolerance
    [(h, values, _)] = results(switch.handle(data(2, 3, [1] * 4), ADDRESSES[2], 1.0))
    assert values == [3] * 4 and h.flags & p.TIMEOUT == 0
    preemptive = p.pack(p.DATA, 5, 2, 0, 1, 0, 3, 0, contributors=2, op_flags=p.PREEMPTIVE, values=[1] * 4)
    assert switch.handle(preemptive, ADDRESSES[0], 2.0) == []
    [(h, values, _)] = results(switch.handle(p.pack(p.DATA, 5, 2, 0, 1, 1, 3, 0, contributors=2,
                                                    op_flags=p.PREEMPTIVE, values=[2] * 4), ADDRESSES[1], 2.0))
    assert values == [3] * 4 and h.contributors == 2 and h.flags & p.K_REACHED


def test_slots_versions_and_history():
    switch = make_switch(2, slots=1, history=1)
    for op, version in ((1, 0), (2, p.VERSION), (3, 0)):  # slot 0 reused, versions alternate
        switch.handle(data(0, 2, [op] * 4, op=op, flags=version), ADDRESSES[0], 0.0)
        [(h, values, _)] = results(switch.handle(data(1, 2, [op] * 4, op=op, flags=version), ADDRESSES[1], 0.0))
        assert values == [2 * op] * 4 and h.op == op
    # op 1's row now holds op 3, but the history (1 entry) holds op 3 only: op 1 is answered OLD
    [(h, values, _)] = results(switch.handle(data(0, 2, [1] * 4, op=1), ADDRESSES[0], 0.0))
    assert h.flags & p.OLD and values == []
    # a new block may not take a row whose block is still open (not self-clocked): bad
    switch.handle(data(0, 2, [1] * 4, op=4, flags=p.VERSION), ADDRESSES[0], 0.0)
    assert switch.handle(data(0, 2, [1] * 4, op=6, flags=p.VERSION), ADDRESSES[0], 0.0) == []
    assert switch.jobs[5].counters["bad"] == 1


def test_jobs_never_mix_and_foreign_packets_are_counted():
    switch = make_switch(2, job=1)
    params = p.JoinParams(4, 2, 16, 8)
    for rank in range(2):
        switch.handle(p.pack(p.JOIN, 2, 0, 0, 0, rank, 2, 0, values=params.to_values()), ADDRESSES[4 + rank], 0.0)
    switch.handle(data(0, 2, [1] * 4, job=1), ADDRESSES[0], 0.0)
    switch.handle(data(0, 2, [1000] * 4, job=2), ADDRESSES[4], 0.0)
    [(_, values, receivers)] = results(switch.handle(data(1, 2, [2] * 4, job=1), ADDRESSES[1], 0.0))
    assert values == [3] * 4 and receivers == ADDRESSES[:2]
    before = dict(switch.jobs[1].counters)
    assert switch.handle(data(1, 2, [7] * 4, job=1), ADDRESSES[5], 0.0) == []      # rank 1 of job 1, wrong address
    assert switch.handle(data(5, 6, [7] * 4, job=1), ADDRESSES[0], 0.0) == []      # world mismatch / rank outside
    assert switch.handle(data(0, 2, [7] * 4, job=99), ADDRESSES[0], 0.0) == []     # unknown job
    assert switch.jobs[1].counters["bad"] == before["bad"] + 2 and switch.counters["bad"] == 3
    mismatch = p.pack(p.JOIN, 1, 0, 0, 0, 0, 2, 0, values=p.JoinParams(8, 2, 16, 8).to_values())
    assert p.unpack(switch.handle(mismatch, ADDRESSES[0], 0.0)[0][0]).flags & p.BAD
    takeover = p.pack(p.JOIN, 1, 0, 0, 0, 0, 2, 0, values=p.JoinParams(4, 2, 16, 8).to_values())
    reply = switch.handle(takeover, ADDRESSES[7], 0.0)[0][0]  # rank 0 of job 1 from a stranger's address
    assert p.unpack(reply).flags & p.BAD and p.values_of(reply, 1)[0] == 6


def test_a_full_table_evicts_the_longest_silent_job_that_never_completed_a_block():
    switch = Switch(SwitchConfig(port=0, max_jobs=3, evict_after_s=5.0))
    params = p.JoinParams(4, 2, 16, 8).to_values()

    def join(job_id, rank, world, address, now):
        [(reply, _)] = switch.handle(p.pack(p.JOIN, job_id, 0, 0, 0, rank, world, 0, values=params), address, now)
        return p.unpack(reply).flags & p.BAD == 0

    assert join(1, 0, 1, ADDRESSES[0], 0.0)  # a real job: it completes a block, so it is never evicted
    assert results(switch.handle(data(0, 1, [1] * 4, job=1), ADDRESSES[0], 0.0))[0][1] == [1] * 4
    assert join(2, 0, 2, ADDRESSES[1], 0.0) and join(3, 1, 2, ADDRESSES[2], 1.0)  # stray JOINs fill the table
    assert not join(4, 0, 2, ADDRESSES[3], 4.9)  # nobody unproven has been silent 5 s yet: rejected
    assert join(4, 0, 2, ADDRESSES[3], 5.0)  # job 2 has: it makes room for job 4
    assert set(switch.jobs) == {1, 3, 4} and switch.counters["jobs_evicted"] == 1
    assert switch.job_counters()[2] == {name: 0 for name in p.COUNTERS}  # still in the exit summary
    switch.handle(p.pack(p.STATS, 4, 0, 0, 0, 0, 2, 0), ADDRESSES[3], 98.0)  # job 4's keep-alive
    assert join(5, 0, 2, ADDRESSES[4], 100.0)  # evicts job 3 (silent 99 s), not job 4 (2 s) nor job 1 (proven)
    assert set(switch.jobs) == {1, 4, 5} and switch.counters["jobs_evicted"] == 2
    assert not join(6, 0, 2, ADDRESSES[5], 100.5)
    assert (switch.counters["joins_rejected"], switch.counters["jobs_expired"]) == (2, 0)


def test_switch_survives_random_datagrams_without_growing():
    """10,000 random and mutated datagrams over real UDP: no crash, bounded memory, all counted; the jobs
    stray JOINs create fill the table, and a real job still gets in without waiting for idle_s (300 s)."""
    with Switch(SwitchConfig(port=0, max_jobs=8, evict_after_s=0.5)) as switch:
        _fuzz(switch)


def _fuzz(switch):
    rng = random.Random(1)
    valid = [p.pack(p.DATA, 3, 1, 0, 0, 0, 2, 0, values=np.arange(4, dtype=np.int32)),
             p.pack(p.JOIN, 3, 0, 0, 0, 1, 2, 0, values=p.JoinParams(64, 8, 16, 16).to_values()),
             p.pack(p.STATS, 3, 0, 0, 0, 0, 2, 0), p.pack(p.LEAVE, 3, 0, 0, 0, 0, 2, 0)]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    memory_limit = switch.config.max_jobs * switch.config.max_job_bytes
    for i in range(10_000):
        if i % 2:
            packet = bytearray(rng.choice(valid))
            for _ in range(rng.randint(1, 6)):
                packet[rng.randrange(len(packet))] = rng.randrange(256)
            datagram = bytes(packet[:rng.randint(0, len(packet))] if i % 7 == 0 else packet)
        else:
            datagram = bytes(rng.randrange(256) for _ in range(rng.randint(0, 80)))
        sender.sendto(datagram, switch.address)
        if i % 500 == 0:
            time.sleep(0.005)  # let the switch drain (a UDP socket buffer is finite)
    deadline = time.monotonic() + 10
    while switch.counters["rx"] < 9_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    sender.close()
    assert switch._thread.is_alive() and switch.counters["internal_errors"] == 0
    assert switch.counters["rx"] >= 9_000 and switch.counters["bad"] > 4_000
    assert len(switch.jobs) <= switch.config.max_jobs and switch.memory_bytes() <= memory_limit
    from stepscope.innet.switch.process import probe

    assert probe(f"127.0.0.1:{switch.address[1]}")["internal_errors"] == 0  # alive and answering
    # stray JOINs filled the table with jobs that never completed a block; once they have been silent for
    # evict_after_s, a real job's JOIN evicts one of them
    assert len(switch.jobs) == switch.config.max_jobs and not any(j.proven for j in switch.jobs.values())
    time.sleep(switch.config.evict_after_s + 0.1)
    # stray JOINs still in flight may evict junk jobs too: count only the real job's eviction
    evicted_before = switch.counters["jobs_evicted"]
    from tests.innet.conftest import job, run_ranks

    def rank(r):
        with job(switch, r, 2, job_id=77, pipes=1) as member:
            return member.all_reduce(np.full(100, r + 1, np.int32), "sum")

    sums = run_ranks(2, rank)
    assert all((x == 3).all() for x in sums)
    assert switch.counters["jobs_evicted"] == evicted_before + 1 and 77 in switch.job_counters()
