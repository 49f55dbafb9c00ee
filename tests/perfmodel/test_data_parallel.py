"""Data-parallel communication as each stack schedules it (model/data_parallel.py), against hand computations and
an independent step-by-step simulation of Megatron-Core's reduction stream."""

import dataclasses

import numpy as np
import pytest

from stepscope.perfmodel.model.collectives import collective_time
from stepscope.perfmodel.model.data_parallel import (
    AFTER_BACKWARD_BUCKET,
    DataParallelTerms,
    Windows,
    _megatron_reduce,
    data_parallel_terms,
    exposed,
)
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system

H100 = load_system("H100-SXM")


def simulated_megatron(chunk, total, last, experts, backward, pp, v, p2p):
    """Megatron-Core's stream of reductions written as an event simulation, independent of the closed form: times
    relative to the end of the first rank's backward; each chunk launched when its last backward ends and run after
    the one before it on the stream."""
    slot = backward / v
    stream = -(v - 1) * pp * slot - slot + experts  # the expert buckets go first
    for c in range(v - 1, 0, -1):
        stream = max(stream, -c * pp * slot) + chunk
    begin = max(stream, -slot)
    rank0 = max(begin + total, last)  # chunk 0 in buckets over its last slot, the last bucket launched at the end
    earlier = slot + p2p
    second = stream - earlier  # the second rank runs the same chain one chunk-slot and one send earlier
    rank1 = max(second, -earlier) + chunk if pp > 1 else -np.inf
    return max(0.0, rank0, rank1)


@pytest.mark.parametrize("chunk", [0.001, 0.02, 0.2])
@pytest.mark.parametrize("pp, v", [(1, 1), (4, 1), (4, 2), (8, 4), (16, 8)])
def test_megatron_reduction_chain_equals_a_step_by_step_simulation(chunk, pp, v):
    backward, p2p, experts = 0.05, 0.0003, 0.004
    total, last = 3 * chunk, chunk / 2
    w = Windows(forward=0.02, backward=backward, p2p=p2p, optimizer=0.01, blocks=4)
    closed = _megatron_reduce(total, last, chunk, experts, w, pp, v, share=0.0)
    assert float(closed) == pytest.approx(simulated_megatron(chunk, total, last, experts, backward, pp, v, p2p),
                                          rel=1e-12, abs=1e-15)


def test_megatron_buckets_grow_with_the_data_parallel_group():
    """Megatron-Core's default bucket: max(40M, 1M x dp) parameters; 100M parameters over dp 64 are one bucket of
    64M and a last one of 36M (fp32 gradients: 4 bytes each)."""
    layout = {"dp_cp": np.array(8.0), "shard": np.array(8.0), "replica": np.array(1.0), "edp": np.array(8.0)}
    sizes = {"dp_cp": np.array(64.0), "shard": np.array(64.0), "replicas": np.array(1.0), "edp": np.array(64.0)}
    terms = data_parallel_terms("megatron", layout, H100.network, sizes, params=np.array(100e6), experts=np.array(0.0),
                                blocks=np.array(10.0), root=np.array(0.0), zero3_bytes=np.array(200e6),
                                zero3_expert_bytes=np.array(0.0), act_bytes=2, grad_bytes=4, chunks=np.array(1.0),
                                bucket_cap_MiB=25.0)
    net = H100.network
    full = collective_time("all-reduce", 64e6 * 4, 64, 8, net)
    rest = collective_time("all-reduce", 36e6 * 4, 64, 8, net)
    assert terms.bucketed["all-reduce"][0] == pytest.approx(full + rest)
    assert terms.bucketed["all-reduce"][1] == pytest.approx(rest)
    # DeepSpeed's 5e8-element buckets hold the whole stage
    after = data_parallel_terms("after-backward", layout, net, sizes, params=np.array(100e6), experts=np.array(0.0),
                                blocks=np.array(10.0), root=np.array(0.0), zero3_bytes=np.array(200e6),
                                zero3_expert_bytes=np.array(0.0), act_bytes=2, grad_bytes=4, chunks=np.array(1.0),
                                bucket_cap_MiB=25.0)
    assert AFTER_BACKWARD_BUCKET > 100e6
    assert after.bucketed["all-reduce"][0] == pytest.approx(collective_time("all-reduce", 400e6, 64, 8, net))


def test_each_stack_shows_its_own_share_of_the_same_reduction():
    """The same 8-rank data-parallel plan: Megatron-LM 2022 all-reduces after the backward (everything shows),
    PyTorch DDP and Megatron-Core hide all but their last bucket behind the last backward."""
    spec, workload = get_preset("llama3-8b"), Workload(batch=32, seq=4096, precision="bf16", mode="fwd-bwd")
    plans = {stack: ParallelPlan(dp=8, micro_batch=1, stack=stack) for stack in
             ("megatron-lm-2022", "pytorch-ddp", "megatron-core")}
    dp = {stack: evaluate(spec, workload, plan, H100).breakdown["dp_comm"] for stack, plan in plans.items()}
    net = H100.network
    params = spec.param_count()
    # after the backward: one 5e8-element bucket... the model holds 8.0B parameters: 16 buckets of 5e8, the rest last
    full = int(params // 5e8)
    by_hand = full * collective_time("all-reduce", 5e8 * 2, 8, 8, net) + collective_time(
        "all-reduce", (params - full * 5e8) * 2, 8, 8, net)
    assert dp["megatron-lm-2022"] == pytest.approx(by_hand, rel=1e-9)
    assert dp["pytorch-ddp"] < dp["megatron-lm-2022"] and dp["megatron-core"] < dp["megatron-lm-2022"]


def test_fsdp_blocks_by_hand():
    """ZeRO-3 under FSDP: per pass the first block's gather shows, then each later block's beyond one block's
    compute; in the backward a block's reduce-scatter shares the links with the next block's gather, so it hides
    only behind what the gather leaves of the block's compute; the root's (embedding and head) shows after the
    end."""
    none = {"all-reduce": 0.0, "reduce-scatter": 0.0}
    terms = DataParallelTerms(bucketed={k: (0.0, 0.0) for k in none}, chunk=none, experts=none, replicas=(0.0, 0.0),
                              gather={"updated": (0.0, 0.0), "zero3": (1.0, 0.1)}, block_gather=0.03,
                              block_reduce=0.05, root_reduce=0.08, chunks=1.0)
    w = Windows(forward=0.2, backward=0.4, p2p=0.0, optimizer=0.0, blocks=10)  # 0.02 and 0.04 per block
    reduce_s, gather_s = exposed("fsdp", terms, w, zero=np.array(3), pp=np.array(1), interleave=np.array(1),
                                 rounds=1, micro_batches=np.array(1), backward=True, train=True,
                                 reshard_after_forward=True, overlap=True, share=0.0)
    forward = 0.03 + 9 * (0.03 - 0.02)  # the first gather, then 10 ms more than each block's 20 ms of compute
    backward = 0.03 + 9 * 0.0  # 30 ms gathers hide behind 40 ms blocks
    assert float(gather_s) == pytest.approx(forward + backward)
    assert float(reduce_s) == pytest.approx(0.08 + 9 * (0.05 - (0.04 - 0.03)))  # 10 ms of window left by the gather
    # the SM share of what hides is charged on top
    _, shared = exposed("fsdp", terms, w, zero=np.array(3), pp=np.array(1), interleave=np.array(1), rounds=1,
                        micro_batches=np.array(1), backward=True, train=True, reshard_after_forward=True,
                        overlap=True, share=0.1)
    assert float(shared) == pytest.approx(forward + backward + 0.1 * 9 * (0.02 + 0.03))


def test_the_sm_share_of_overlapped_collectives_is_on_the_network():
    assert H100.network.collective_sms == 16 and H100.accelerator.sm_count == 132
    no_share = dataclasses.replace(H100, network=dataclasses.replace(H100.network, collective_sms=0))
    spec, workload = get_preset("llama3-8b"), Workload(batch=32, seq=4096, precision="bf16", mode="fwd-bwd")
    plan = ParallelPlan(dp=8, micro_batch=1)
    assert (evaluate(spec, workload, plan, H100).breakdown["dp_comm"]
            > evaluate(spec, workload, plan, no_share).breakdown["dp_comm"])
