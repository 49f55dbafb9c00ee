"""The discrete-event simulator: agreement with the emulator's counters on small cases, the ideal bounds,
and the published qualitative behaviour (deterministic seeds; no timing assertions)."""

import threading

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.innet.sim.config import SimConfig
from stepscope.innet.sim.model import ideal_bounds, simulate
from stepscope.innet.worker.faults import FaultConfig
from tests.innet.conftest import job, run_ranks

COUNTERS = ("ok", "to", "kr", "re", "dup", "old")
WORLD, NUMEL = 3, 640  # k = 64: 10 data blocks + 8 prologue blocks (slots 8) = 18 blocks
NO_FAULTS = FaultConfig()


RTO_MS = 20_000  # no retransmission unless a packet is lost: a loaded machine cannot make one happen


def emulate(switch, job_id, k=None, straggle=False, faults=NO_FAULTS, sto_ms=5.0):
    """Counters of one all-reduce on the real switch. The straggler starts only once its peers have their
    results, and rank 0 reads the counters only once every rank's packets (duplicates included, sent before
    their result came back) are in: the order is set by barriers, not by how fast threads run."""
    peers_done = threading.Barrier(WORLD)  # with a straggler: its peers finish, then it starts
    all_done = threading.Barrier(WORLD)

    def rank(r):
        member = job(switch, r, WORLD, job_id=job_id, pipes=1, slots=8, rto_ms=RTO_MS, rto_max_ms=2 * RTO_MS,
                     sto_ms=sto_ms, faults=faults, timeout_s=60)
        straggler = straggle and r == WORLD - 1
        if straggler:
            peers_done.wait(timeout=60)
        member.all_reduce(np.ones(NUMEL, np.float32), "avg", k=k)
        if straggle and not straggler:
            peers_done.wait(timeout=60)
        all_done.wait(timeout=60)
        stats = member.stats() if r == 0 else None
        all_done.wait(timeout=60)  # nobody leaves before rank 0 has read the counters
        member.close()
        return stats

    return run_ranks(WORLD, rank, timeout_s=120)[0]


def model(**options):
    return simulate(SimConfig(workers=WORLD, pipes=1, slots=8, op_bytes=4 * NUMEL, rto_ms=RTO_MS,
                              rto_max_ms=2 * RTO_MS, stall_prob=0, sto_ms=5.0, **options))


@pytest.mark.parametrize("case", ["all-ranks", "straggler", "duplicates"])
def test_simulator_and_emulator_agree_on_small_cases(switch, case):
    if case == "all-ranks":
        emulated, simulated = emulate(switch, 21), model()
    elif case == "straggler":
        emulated = emulate(switch, 22, k=2, straggle=True)
        simulated = model(k=2, straggler_ranks=(WORLD - 1,), straggler_ms=1000)
    else:
        emulated = emulate(switch, 23, faults=FaultConfig(duplicate=1.0))
        simulated = model(duplicate=1.0)
    assert {c: emulated[c] for c in COUNTERS} == {c: simulated[c] for c in COUNTERS}
    expected = {"all-ranks": (18, 0, 0), "straggler": (0, 18, 0), "duplicates": (18, 0, 18 * WORLD)}[case]
    assert (simulated["ok"], simulated["to"], simulated["dup"]) == expected


def test_ideal_bounds():
    bounds = ideal_bounds(SimConfig(workers=6, link_Gbps=100, pipes=4))
    # a 100 Gb/s link carries 12.5 GB/s
    assert bounds["ideal_ring_algbw_GBps"] == pytest.approx(12.5 * 6 / 10)
    assert bounds["ideal_innet_algbw_GBps"] == pytest.approx(12.5 * 1024 / (1024 + 32 + 66))


def test_line_rate_without_noise_approaches_the_bound():
    result = simulate(SimConfig(op_bytes=20_000_000, stall_prob=0, jitter_us=0))
    assert 0.8 * result["ideal_innet_algbw_GBps"] < result["algbw_GBps"] <= result["ideal_innet_algbw_GBps"]
    assert result["to"] == 0 and result["re"] == 0 and result["sim_packets"] > 100_000


def test_short_timeouts_fire_without_stragglers_and_long_ones_cost_throughput():
    runs = {sto: simulate(SimConfig(op_bytes=10_000_000, k=5, sto_ms=sto, stall_prob=2e-4, seed=1))
            for sto in (0.05, 1.0, 12.5)}
    assert runs[0.05]["to"] > runs[1.0]["to"] > runs[12.5]["to"] == 0
    assert runs[0.05]["algbw_GBps"] > runs[12.5]["algbw_GBps"]


def test_fastest_k_hides_a_straggler():
    straggler = dict(workload="waited", ops=2, op_bytes=10_000_000, straggler_ranks=(5,), straggler_ms=2000)
    tolerant = simulate(SimConfig(k=5, **straggler))
    waiting = simulate(SimConfig(**straggler))
    assert waiting["op_ms_mean"] >= 2000 > 10 * tolerant["op_ms_mean"]
    assert tolerant["to"] == tolerant["blocks"]


def test_straggler_steps_limit_the_ops_that_straggle():
    straggler = dict(workers=2, workload="waited", ops=4, op_bytes=4096, stall_prob=0, straggler_ranks=(1,),
                     straggler_ms=100)
    every_op = simulate(SimConfig(**straggler))
    second_op = simulate(SimConfig(**straggler, straggler_steps=(1, 1)))
    assert every_op["op_ms_mean"] >= 100 > 50 > second_op["op_ms_mean"] >= 100 / 4


def test_invalid_configurations_are_usage_errors():
    for bad in (dict(workers=1), dict(link_Gbps=1000), dict(pipes=5), dict(k=9), dict(loss=1.0),
                dict(workload="sometimes"), dict(straggler_ranks=(6,)), dict(straggler_steps=(3, 1))):
        with pytest.raises(UsageError):
            simulate(SimConfig(**bad))


def test_a_finite_switch_packet_rate_bounds_the_throughput():
    """Every contribution costs the switch 2 / pps (its receive and its share of the results): with 4 workers at
    0.2 M packets/s, a block of 1 KiB costs 4 x 10 us, so 1 MiB (1024 blocks) takes 41 ms (int32: no prologue)."""
    config = SimConfig(workers=4, link_Gbps=400, op_bytes=1 << 20, quantized=False, switch_Mpps=0.2,
                       stall_prob=0, jitter_us=0, issue_skew=0)
    result = simulate(config)
    assert result["op_ms_mean"] == pytest.approx(1024 * 4 * 2 / 0.2e6 * 1e3, rel=0.02)
    line_rate = simulate(SimConfig(**{**config.to_dict(), "switch_Mpps": None}))
    assert line_rate["op_ms_mean"] < result["op_ms_mean"] / 20
    host_bound = simulate(SimConfig(**{**config.to_dict(), "switch_Mpps": None, "worker_Mpps": 0.2}))
    assert host_bound["op_ms_mean"] == pytest.approx(1024 * 2 / 0.2e6 * 1e3, rel=0.05)  # each worker: 10 us/packet
    with pytest.raises(UsageError):
        SimConfig(switch_Mpps=0).validate()
