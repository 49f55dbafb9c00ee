"""Collective formulas, ZeRO memory per stage, pipeline bubble, data-parallel overlap, MFU sanity."""

import dataclasses

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel import evaluate
from stepscope.perfmodel.model.collectives import (
    all_gather,
    all_reduce,
    members_per_domain,
    p2p,
    reduce_scatter,
    ring_all_reduce,
    tree_all_reduce,
)
from stepscope.perfmodel.model.schedule import dp_exposed, gradient_reductions, size_buckets, zero3_gathers
from stepscope.perfmodel.model.step import state_bytes
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system

NCCL = load_system("A100-80GB").network
NET = dataclasses.replace(NCCL, collectives="alpha-beta")  # the additive textbook model (gloo; calibrate's fit)
B_I, A_I = NET.intra.bytes_per_s, NET.intra.latency_s
B_E, A_E = NET.inter.bytes_per_s, NET.inter.latency_s
LAUNCH = NCCL.launch_us * 1e-6
S = 1e9


def test_ring_all_reduce_keeps_the_factor_two_inside_one_tier():
    # 8 ranks in one NVLink domain: 2(n-1)/n·S/B + 2(n-1)·α (the LBNL model dropped the 2 here)
    assert ring_all_reduce(S, 8, 8, NET) == pytest.approx(2 * 7 / 8 * S / B_I + 14 * A_I)
    assert all_reduce(S, 8, 8, NET) == pytest.approx(2 * 7 / 8 * S / B_I + 14 * A_I)


def test_two_tier_all_reduce_and_reduce_scatter():
    # 64 ranks, 8 per domain: NVLink part on S, NIC part on S/8
    expected = 2 * 7 / 8 * S / B_I + 14 * A_I + 2 * 7 / 8 * (S / 8) / B_E + 14 * A_E
    assert all_reduce(S, 64, 8, NET) == pytest.approx(expected)
    rs = 7 / 8 * S / B_I + 7 * A_I + 7 / 8 * (S / 8) / B_E + 7 * A_E
    assert reduce_scatter(S, 64, 8, NET) == pytest.approx(rs) and all_gather(S, 64, 8, NET) == pytest.approx(rs)
    # one rank per domain: everything on the NICs
    assert reduce_scatter(S, 4, 1, NET) == pytest.approx(3 / 4 * S / B_E + 3 * A_E)


def test_tree_wins_for_small_messages_and_single_ranks_cost_nothing():
    small = 1024.0
    assert tree_all_reduce(small, 64, 8, NET) < ring_all_reduce(small, 64, 8, NET)
    assert all_reduce(small, 64, 8, NET) == tree_all_reduce(small, 64, 8, NET)
    assert all_reduce(S, 1, 1, NET) == reduce_scatter(S, 1, 1, NET) == 0.0
    assert p2p(S, True, NET) == pytest.approx(A_I + S / B_I) and p2p(S, False, NET) == pytest.approx(A_E + S / B_E)


def test_nccl_rings_move_both_tiers_at_once_and_hide_hop_latency_behind_large_messages():
    """NCCL's ring, by hand: the bytes each GPU sends, (n-1)/n·S (twice for all-reduce), split between its NVLink
    ((g-1)/g) and its NIC (1/g), both busy at once; the hops' latency shows only where it exceeds the transfer."""
    assert NCCL.collectives == "nccl" and NCCL.launch_us == 8.4
    # one domain of 8: NVLink only
    assert all_reduce(S, 8, 8, NCCL) == pytest.approx(LAUNCH + 2 * 7 / 8 * S / B_I)
    assert reduce_scatter(S, 8, 8, NCCL) == pytest.approx(LAUNCH + 7 / 8 * S / B_I)
    # 64 ranks, 8 per domain: the NIC carries 1/8 of what each GPU sends; A100: 300 GB/s x 0.7 NVLink, 25 x 0.96 NIC
    nic, nvlink = 1 / 8 / B_E, 7 / 8 / B_I
    assert nic > nvlink
    assert reduce_scatter(S, 64, 8, NCCL) == pytest.approx(LAUNCH + 63 / 64 * S * nic)
    # all-reduce: the ring (2·63/64·S·nic, 112 NVLink + 14 network hops) against NCCL's tree across the 8 domains
    # (2·S·max(1/B_I, nic), 2·(7 NVLink + 3 network hops)); the tuner takes the smaller sum, its time the larger term
    ring = (2 * 63 / 64 * S * nic, 2 * (56 * A_I + 7 * A_E))
    tree = (2 * S * max(1 / B_I, nic), 2 * (7 * A_I + 3 * A_E))
    chosen = min(ring, tree, key=sum)
    assert all_reduce(S, 64, 8, NCCL) == pytest.approx(LAUNCH + max(chosen))
    # a small message over many domains is latency-bound: the ring pays its hops, so the tuner takes the tree
    small = 64 * 1024.0
    assert all_reduce(small, 1024, 8, NCCL) == pytest.approx(LAUNCH + 2 * (7 * A_I + 7 * A_E))


def test_nccl_pat_serves_one_gpu_per_domain():
    """Reduce-scatter over 1,024 domains with one GPU each: PAT's log2(N)·α/3.5 + 2.8 µs per rank beats the ring's
    1,023 network hops for a small message, at 0.75 of the ring's bandwidth; a large one rides the ring."""
    small, large = 1e6, 1e10
    pat_latency = 10 * A_E / 3.5 + 2.8e-6 * 1024
    assert reduce_scatter(small, 1024, 1, NCCL) == pytest.approx(
        LAUNCH + max(1023 / 1024 * small / (0.75 * B_E), pat_latency))
    assert reduce_scatter(large, 1024, 1, NCCL) == pytest.approx(LAUNCH + 1023 / 1024 * large / B_E)


def test_members_per_domain():
    assert members_per_domain(8, 1, 8) == 8  # tp inside the node
    assert members_per_domain(32, 8, 8) == 1  # dp across nodes after tp=8
    assert members_per_domain(16, 2, 8) == 4  # straddles: 4 per domain
    assert members_per_domain(1, 64, 8) == 1


@pytest.mark.parametrize("n", [1, 8, 64])
def test_zero_bytes_per_parameter(n):
    def total(precision, zero, fp32_grads=False):
        return float(sum(state_bytes(precision, zero, n, fp32_grads)))

    assert total("bf16", 0) == pytest.approx(16)
    assert total("bf16", 1) == pytest.approx(4 + 12 / n)
    assert total("bf16", 2) == pytest.approx(2 + 14 / n)
    assert total("bf16", 3) == pytest.approx(16 / n)
    assert total("bf16", 0, fp32_grads=True) == pytest.approx(18)
    assert total("bf16", 1, fp32_grads=True) == pytest.approx(6 + 12 / n)  # Megatron distributed optimizer
    assert total("fp32", 0) == pytest.approx(16) and total("fp32", 1) == pytest.approx(8 + 8 / n)


def test_zero_memory_in_a_prediction_follows_the_stage():
    spec, system = get_preset("llama3-8b"), load_system("H100-SXM")
    workload = Workload(batch=64, seq=4096, precision="bf16", mode="train")
    params = spec.param_count()
    for zero, per_param in ((0, 16), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)):
        p = evaluate(spec, workload, ParallelPlan(dp=8, zero=zero, micro_batch=1), system)
        state = p.memory.weights + p.memory.grads + p.memory.optimizer
        assert state == pytest.approx(params * per_param)


@pytest.mark.parametrize("pp, v, batch", [(4, 1, 16), (4, 2, 32), (8, 4, 64)])
def test_pipeline_bubble_is_p_minus_1_over_v_m(pp, v, batch):
    spec = get_preset("gpt3-175b")
    workload = Workload(batch=batch, seq=2048, precision="bf16", mode="fwd-bwd")
    plan = ParallelPlan(tp=8, pp=pp, interleave=v, micro_batch=1)
    p = evaluate(spec, workload, plan, load_system("A100-80GB"))
    m = p.micro_batches
    # the idle slots; the sends of the fill and drain, which an interleaved schedule cannot hide, are pp_comm
    assert p.breakdown["bubble"] / (p.phases["forward"] + p.phases["backward"]) == pytest.approx((pp - 1) / (v * m))
    sends = 2 * (pp - 1) * p2p(2048 * 12288 * 2, False, NCCL) if v > 1 else 0.0  # one per boundary each way
    assert p.phases["bubble"] - p.breakdown["bubble"] == pytest.approx(sends)


def test_each_pipeline_round_fills_and_drains_the_pipeline_again():
    # gradient accumulation outside the schedule: r rounds of m/r micro-batches, each with its own bubble
    spec, system = get_preset("gpt3-175b"), load_system("A100-80GB")
    workload = Workload(batch=32, seq=2048, precision="bf16", mode="train")
    plan = ParallelPlan(tp=8, pp=8, micro_batch=1)
    one = evaluate(spec, workload, plan, system)
    four = evaluate(spec, workload, plan.replace(pipeline_rounds=4), system)
    assert four.phases["bubble"] == pytest.approx(4 * one.phases["bubble"])
    assert four.step_s - one.step_s == pytest.approx(3 * one.phases["bubble"])
    assert {k: v for k, v in four.phases.items() if k != "bubble"} == pytest.approx(
        {k: v for k, v in one.phases.items() if k != "bubble"})
    # 1F1B: rank 0 holds min(p, m) micro-batches: 8 of 32 in one schedule, the whole round of 32 / 16 = 2 in 16
    sixteen = evaluate(spec, workload, plan.replace(pipeline_rounds=16), system)
    assert sixteen.memory.activations == pytest.approx(one.memory.activations * 2 / 8)
    assert "rounds4" in plan.replace(pipeline_rounds=4).describe()


def test_fsdp_under_a_pipeline_schedule_reduces_and_gathers_once_per_round():
    # torch.distributed.pipelining: gradients accumulate unsharded through a round and are reduce-scattered at its
    # last backward; with reshard_after_forward off the weights are gathered once per round
    spec, system = get_preset("llama3-8b"), load_system("H100-SXM")
    workload = Workload(batch=64, seq=4096, precision="bf16", mode="train")
    plan = ParallelPlan(dp=4, pp=2, micro_batch=1, zero=3, reshard_after_forward=False, dp_overlap=False)
    one = evaluate(spec, workload, plan, system)
    two = evaluate(spec, workload, plan.replace(pipeline_rounds=2), system)
    assert two.breakdown["dp_comm"] == pytest.approx(2 * one.breakdown["dp_comm"])
    assert gradient_reductions(2, 1, 3, 16) == 1 and gradient_reductions(2, 4, 3, 16) == 4  # once per round
    assert gradient_reductions(1, 1, 3, 16) == 16  # no schedule: sharded gradients per micro-batch
    assert gradient_reductions(1, 1, 1, 16) == 1
    # at the peak only the optimizer state is sharded: the memory of ZeRO-1
    zero1 = evaluate(spec, workload, plan.replace(zero=1), system).memory
    assert (one.memory.weights, one.memory.grads, one.memory.optimizer) == pytest.approx(
        (zero1.weights, zero1.grads, zero1.optimizer))
    # without a pipeline ZeRO-3 keeps its shards
    assert evaluate(spec, workload, plan.replace(pp=1, dp=8), system).memory.grads <= zero1.grads / 2


def test_zero3_gathers_per_step_by_schedule_and_resharding():
    # (forward, backward) gathers: (pp, rounds, micro-batches, backward, reshard after forward)
    assert zero3_gathers(1, 1, 16, True, True) == (16, 16)  # every pass gathers
    assert zero3_gathers(1, 1, 16, True, False) == (16, 0)  # forward's copy serves the backward
    assert zero3_gathers(4, 2, 16, True, True) == (2 * 4, 16)  # each backward, and each round's warm-up forward
    assert zero3_gathers(4, 2, 16, True, False) == (2, 0)  # once per round
    assert zero3_gathers(4, 1, 16, False, True) == (16, 0) and zero3_gathers(4, 1, 16, False, False) == (1, 0)


def test_pipeline_rounds_must_split_the_micro_batches():
    spec = get_preset("gpt3-175b")
    with pytest.raises(UsageError, match="pipeline_rounds=3 does not divide the 32 micro-batches"):
        ParallelPlan(tp=8, pp=8, pipeline_rounds=3).check(spec, 32, 2048)
    with pytest.raises(UsageError, match="8 micro-batches of each pipeline round to be a multiple of pp=16"):
        ParallelPlan(tp=8, pp=16, interleave=2, pipeline_rounds=4).check(spec, 32, 2048)
    with pytest.raises(UsageError, match="pipeline_rounds must be a positive integer"):
        ParallelPlan(pipeline_rounds=0)


def test_data_parallel_overlap_hides_all_but_the_last_bucket():
    assert size_buckets(100e6, 30e6) == (3, 10e6)  # three full buckets of 30M elements and the last of 10M
    assert size_buckets(30e6, 30e6) == (0, 30e6)
    # buckets of 3, 3, 3 and 1 seconds
    assert dp_exposed(10.0, 1.0, window_s=100.0, overlap=True) == 1.0  # only the last bucket shows
    assert dp_exposed(10.0, 1.0, window_s=4.0, overlap=True) == 6.0  # the window is too short
    assert dp_exposed(10.0, 1.0, window_s=100.0, overlap=False) == 10.0
    spec, system = get_preset("megatron-1.7b"), load_system("A100-80GB")
    workload = Workload(batch=512, seq=2048, precision="bf16", mode="fwd-bwd")
    ddp = ParallelPlan(dp=32, micro_batch=4, stack="pytorch-ddp")  # PyTorch DDP's size buckets
    overlapped = evaluate(spec, workload, ddp, system)
    serial = evaluate(spec, workload, ddp.replace(dp_overlap=False), system)
    assert 0 < overlapped.breakdown["dp_comm"] < serial.breakdown["dp_comm"]
    # a bucket layout passed in (e.g. from the DDP bucket planner) is used as given
    layout = [spec.param_count() - 500_000_000, 500_000_000]
    big_last = evaluate(spec, workload, ddp, system, bucket_elements=layout)
    assert big_last.breakdown["dp_comm"] >= all_reduce(500_000_000 * 2, 32, 8, system.network)  # launched last
    assert big_last.breakdown["dp_comm"] > 2 * overlapped.breakdown["dp_comm"]


def test_mfu_below_peak_and_hfu_counts_recompute():
    spec, system = get_preset("gpt3-175b"), load_system("A100-80GB")
    workload = Workload(batch=1536, seq=2048, precision="bf16", mode="train")
    for recompute in ("none", "selective", "full"):
        p = evaluate(spec, workload, ParallelPlan(dp=8, tp=8, pp=16, recompute=recompute, flash_attention=False),
                     system)
        assert 0 < p.mfu_pct < 100
        assert (p.hfu_pct > p.mfu_pct) == (recompute != "none")
    assert sum(p.breakdown.values()) == pytest.approx(p.step_s)


def test_gradient_tensors_feed_the_ddp_bucket_planner():
    """GPT-2 small under DDP defaults: 12 buckets of 7,087,872 floats and a last one of 39,385,344."""
    from stepscope.perfmodel.model.tensors import gradient_tensors
    from stepscope.spec.buckets import bucket_numels, plan_buckets

    spec = get_preset("gpt2")
    workload = Workload(batch=8, seq=1024, precision="fp32", mode="fwd-bwd")
    plan = ParallelPlan(dp=8, micro_batch=1, stack="pytorch-ddp")
    entries = gradient_tensors(spec, workload, plan)
    assert sum(n for _, n, _ in entries) == spec.param_count()
    layout = bucket_numels(plan_buckets(entries, cap_mb=25, rule="torch"))
    assert layout == [7_087_872] * 12 + [39_385_344]
    system = load_system("A100-80GB")
    planned = evaluate(spec, workload, plan, system, bucket_elements=layout)
    estimated = evaluate(spec, workload, plan, system)
    assert planned.breakdown["dp_comm"] > estimated.breakdown["dp_comm"]  # the embeddings ride in the last bucket


def test_context_parallel_ranks_reduce_gradients_and_share_zero_shards():
    """CP ranks hold the same weights: gradients are reduced and ZeRO state sharded over dp x cp."""
    spec, system = get_preset("llama3-8b"), load_system("H100-SXM")
    workload = Workload(batch=16, seq=8192, precision="bf16", mode="train")
    params = spec.param_count()
    for dp, cp in ((1, 8), (2, 4), (8, 1)):
        p = evaluate(spec, workload, ParallelPlan(dp=dp, cp=cp, zero=1, micro_batch=1), system)
        assert p.memory.optimizer == pytest.approx(params * 12 / 8)
        assert p.breakdown["dp_comm"] > 0


def test_sharded_gradients_are_reduced_after_every_micro_batch():
    spec, system = get_preset("megatron-1.7b"), load_system("A100-80GB")
    workload = Workload(batch=64, seq=2048, precision="bf16", mode="fwd-bwd")
    by_stage = {zero: evaluate(spec, workload, ParallelPlan(dp=16, zero=zero, micro_batch=1, dp_overlap=False),
                               system) for zero in (1, 2)}
    m = by_stage[1].micro_batches
    assert m == 4 and by_stage[2].breakdown["dp_comm"] == pytest.approx(m * by_stage[1].breakdown["dp_comm"])


def test_placement_decides_which_tier_a_group_uses():
    from stepscope.perfmodel.model.candidates import Candidates
    from stepscope.perfmodel.model.layout import group_layout

    def layout(plan, domain):
        return {k: int(v[0]) for k, v in group_layout(Candidates.from_plans([plan]), domain).items()}

    spec, system = get_preset("gpt3-175b"), load_system("A100-80GB")
    workload = Workload(batch=64, seq=2048, precision="bf16", mode="fwd-bwd")
    inner = ParallelPlan(dp=8, tp=8, micro_batch=1, recompute="full", placement=("tp", "cp", "dp", "pp"))
    outer = inner.replace(placement=("dp", "cp", "tp", "pp"))
    assert layout(inner, 8) == {"tp": 8, "cp": 1, "dp": 1, "pp": 1, "dp_cp": 1, "shard": 1, "replica": 1,
                                       "ep": 1, "edp": 1}
    assert layout(outer, 8) == {"tp": 1, "cp": 1, "dp": 8, "pp": 1, "dp_cp": 8, "shard": 8, "replica": 1,
                                      "ep": 1, "edp": 8}
    nvlink, nic = (evaluate(spec, workload, plan, system).breakdown for plan in (inner, outer))
    # the same TP traffic on the NICs instead of NVLink: slower by about the bandwidth ratio (300 vs 25 GB/s)
    assert 8 < nic["tp_comm"] / nvlink["tp_comm"] < 12 and nic["dp_comm"] < nvlink["dp_comm"]
