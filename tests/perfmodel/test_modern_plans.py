"""Uneven pipeline stages, ZeRO/FSDP shard groups (HSDP) and fp8 training: each reduces to what it generalizes,
and each new formula against a hand calculation."""

import dataclasses

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.model import ops
from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.collectives import collective_time
from stepscope.perfmodel.model.evaluate import evaluate, evaluate_many
from stepscope.perfmodel.model.layout import plan_geometry as geometry
from stepscope.perfmodel.model.rates import op_time
from stepscope.perfmodel.model.schedule import held_micro_batches
from stepscope.perfmodel.model.step import GiB
from stepscope.perfmodel.search.search import SearchSpace, search
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system

LLAMA_405B = get_preset("llama3-405b")
H100 = load_system("H100-SXM")
TRAIN = Workload(batch=2048, seq=8192, precision="bf16", mode="train")


def outputs(prediction) -> dict[str, float]:
    return {"step_s": prediction.step_s, **prediction.phases, **prediction.breakdown, **prediction.memory.GiB()}


def test_stage_layers_given_equal_to_the_even_split_change_nothing():
    spec = get_preset("llama3-70b")  # 80 layers
    workload = Workload(batch=256, seq=8192, precision="bf16")
    even = ParallelPlan(dp=4, tp=8, pp=4, interleave=2, micro_batch=1, zero=1, sequence_parallel=True)
    explicit = even.replace(first_stage_layers=20, last_stage_layers=20)
    assert explicit.stage_layers(80) == even.stage_layers(80) == (20, 20, 20)
    assert outputs(evaluate(spec, workload, explicit, H100)) == pytest.approx(outputs(evaluate(spec, workload, even,
                                                                                                 H100)), rel=1e-12)


def test_llama3_405b_stages_of_7_8_7_and_the_fullest_stage_is_the_second():
    plan = ParallelPlan(dp=128, tp=8, pp=16, micro_batch=1, zero=1, sequence_parallel=True, first_stage_layers=7,
                        last_stage_layers=7)
    assert plan.stage_layers(126) == (7, 8, 7)
    with pytest.raises(UsageError, match="pp=16 does not divide n_layers=126"):
        plan.replace(first_stage_layers=0, last_stage_layers=0).check(LLAMA_405B, 2048, 8192)
    with pytest.raises(UsageError, match="do not split n_layers=126"):
        plan.replace(first_stage_layers=6).check(LLAMA_405B, 2048, 8192)
    prediction = evaluate(LLAMA_405B, TRAIN, plan, H100)
    # hand calculation: the first stage holds 16 micro-batches of 7 layers (112 layer-micro-batches), the second
    # 15 of 8 (120): the second is the fullest
    g = geometry(plan, TRAIN)
    per_layer = sum(op.saved_bytes for op in ops.layer_ops(LLAMA_405B, g))
    assert prediction.memory.activations == pytest.approx(120 * per_layer, rel=1e-12)
    # interleaved (v 8) Megatron-Core's schedule would keep (2 x 14 + 7 x 16 + 1)/8 = 17.625 micro-batches' worth
    # on the second rank, more than the step's 16: with so few micro-batches every forward runs before the
    # first backward, and the second stage holds all 16 micro-batches of its 8 layers. That is Meta's 16K-GPU
    # plan, which fits
    interleaved = evaluate(LLAMA_405B, TRAIN, plan.replace(interleave=8), H100)
    assert interleaved.memory.activations == pytest.approx(16 * 8 * per_layer, rel=1e-12)
    assert interleaved.memory.feasible
    # the 8K-GPU plan (dp 64: 32 micro-batches) keeps the 17.625
    eight_k = evaluate(LLAMA_405B, TRAIN, plan.replace(interleave=8, dp=64), H100)
    assert eight_k.memory.activations == pytest.approx(17.625 * 8 * per_layer, rel=1e-12)


def test_pipeline_ranks_hold_what_their_schedule_leaves_in_flight():
    # plain 1F1B: rank r holds min(p - r, m); interleaved (Megatron-Core, v chunks): its warm-up of
    # 2(p - r - 1) + (v - 1)p chunk forwards and the one in flight, in chunks of 1/v, at most m
    assert [held_micro_batches(16, r, 1, 64) for r in (0, 1, 15)] == [16, 15, 1]
    assert [held_micro_batches(16, r, 1, 4) for r in (0, 1, 15)] == [4, 4, 1]
    assert [held_micro_batches(16, r, 8, 64) for r in (0, 1, 15)] == [143 / 8, 141 / 8, 113 / 8]
    assert held_micro_batches(16, 0, 8, 64) == pytest.approx(16 * (1 + 15 / (16 * 8)))  # Korthikanti et al.
    assert held_micro_batches(4, 3, 2, 2) == 2  # every forward before the first backward
    ranks = held_micro_batches(np.array([16, 16, 4]), np.array([0, 15, 3]), np.array([1, 8, 2]), np.array([64, 64, 2]))
    assert ranks.tolist() == [16, 113 / 8, 2]


def test_zero3_gathers_its_weights_for_a_forward_only_step():
    spec = get_preset("llama3-70b")
    workload = Workload(batch=8, seq=8192, precision="bf16", mode="fwd")
    plan = ParallelPlan(dp=8, zero=3, dp_overlap=False)
    prediction = evaluate(spec, workload, plan, H100)
    # hand calculation: one all-gather of the 16-bit weights over the node, no gradient reduction
    gather = collective_time("all-gather", spec.param_count() * 2, 8, 8, H100.network)
    assert prediction.breakdown["dp_comm"] == pytest.approx(gather, rel=1e-9)
    assert prediction.phases["forward"] == pytest.approx(prediction.breakdown["forward_compute"] + gather, rel=1e-9)
    assert prediction.phases["backward"] == 0.0
    zero1 = evaluate(spec, workload, plan.replace(zero=1), H100)
    assert zero1.breakdown["dp_comm"] == 0.0
    # and holds the gathered layer and the prefetched one beside the largest live activation
    layer_params = sum(op.params for op in ops.layer_ops(spec, geometry(plan, workload)))
    assert prediction.memory.activations - zero1.memory.activations == pytest.approx(2 * layer_params * 2, rel=1e-9)


def test_one_shard_group_is_zero3_and_hsdp_adds_the_replica_all_reduce():
    spec = get_preset("llama3-8b")
    workload = Workload(batch=64, seq=8192, precision="bf16", mode="train")
    fsdp = ParallelPlan(dp=64, micro_batch=1, zero=3, dp_overlap=False, stack="pytorch-ddp")  # 25 MiB buckets
    same = fsdp.replace(shard_group=64)
    assert outputs(evaluate(spec, workload, same, H100)) == pytest.approx(outputs(evaluate(spec, workload, fsdp, H100)),
                                                                         rel=1e-12)
    hsdp = fsdp.replace(shard_group=8)  # one node shards, 8 replicas across nodes
    prediction = evaluate(spec, workload, hsdp, H100)
    # hand calculation of the gradient and weight communication (no overlap): per bucket a reduce-scatter in
    # the node, then the all-reduce of its 1/8 across the 8 nodes; weights gathered in the node before the
    # forward and again before the backward
    params = prediction.extras["params_per_gpu"]
    cap = 25 * 2**20 / 2  # 25 MiB buckets of 2-byte gradients, the remainder last
    buckets = [cap] * int(params // cap) + [params - cap * int(params // cap)]
    net = H100.network
    reduce_s = sum(collective_time("reduce-scatter", b * 2, 8, 8, net) for b in buckets)
    replica_s = sum(collective_time("all-reduce", b / 8 * 2, 8, 1, net) for b in buckets)
    gather_s = 2 * collective_time("all-gather", params * 2, 8, 8, net)
    assert prediction.breakdown["dp_comm"] == pytest.approx(reduce_s + replica_s + gather_s, rel=1e-12)
    # the state is sharded over 8 ranks, not 64
    assert prediction.memory.optimizer == pytest.approx(params * 12 / 8, rel=1e-12)
    # FSDP keeping the gathered weights until backward: one gather fewer, full weights in memory
    kept = evaluate(spec, workload, hsdp.replace(reshard_after_forward=False), H100)
    assert kept.breakdown["dp_comm"] == pytest.approx(reduce_s + replica_s + gather_s / 2, rel=1e-12)
    assert kept.memory.weights == pytest.approx(params * 2, rel=1e-12)


def test_fp8_without_cast_costs_and_at_the_bf16_rate_is_bf16(monkeypatch):
    spec = get_preset("llama3-70b")
    plan = ParallelPlan(dp=8, tp=8, pp=4, micro_batch=1, zero=1, sequence_parallel=True)
    bf16, fp8 = (Workload(batch=64, seq=8192, precision=p) for p in ("bf16", "fp8"))
    acc = H100.accelerator
    same_rate = dataclasses.replace(H100, accelerator=dataclasses.replace(
        acc, matrix_TFLOPps={**acc.matrix_TFLOPps, "fp8": 989.0}, fp8_efficiency=1.0,
        gemm_k0={**acc.gemm_k0, "fp8": acc.gemm_k0["bf16"]}))
    monkeypatch.setattr(ops, "FP8_CAST_BYTES", {"delayed": 0, "current": 0, "blockwise": 0})
    monkeypatch.setattr(ops, "FP8_CAST_FLOPS", 0.0)
    monkeypatch.setattr(ops, "FP8_CAST_KERNELS", 0)
    a, b = evaluate(spec, bf16, plan, same_rate), evaluate(spec, fp8, plan, same_rate)
    # these GEMMs are compute-bound, so reading 1-byte inputs changes no time
    assert b.step_s == pytest.approx(a.step_s, rel=1e-12)
    assert (b.memory.weights, b.memory.grads, b.memory.optimizer) == (a.memory.weights, a.memory.grads,
                                                                       a.memory.optimizer)
    assert b.memory.activations < a.memory.activations  # linear-layer inputs saved in fp8
    assert b.peak_flops == a.peak_flops == 989e12  # MFU against the 16-bit peak


def test_fp8_cast_bytes_and_gemm_rate_by_hand():
    spec = get_preset("llama3-8b")
    plan = ParallelPlan(tp=2, micro_batch=1, fp8_recipe="current")
    workload = Workload(batch=1, seq=4096, precision="fp8")
    g = geometry(plan, workload)
    assert g.fp8 and g.act_bytes == 2
    casts = {op.name: op for op in ops.layer_ops(spec, g)}["attn_fp8_casts"]
    tokens, h, kv, t = 4096, 4096, 1024, 2
    qkv = (h + 2 * kv) / t
    elements = tokens * h + h * qkv + tokens * h / t + h * h / t  # qkv and out: inputs and weights
    assert casts.forward.bytes == pytest.approx(6 * elements)  # current scaling: amax read, read, 2 fp8 writes
    assert casts.backward.bytes == pytest.approx(6 * (tokens * qkv + tokens * h))
    qkv_op = {op.name: op for op in ops.layer_ops(spec, g)}["qkv"]
    assert qkv_op.fp8 and qkv_op.forward.bytes == pytest.approx((tokens * h + h * qkv) * 1 + tokens * qkv * 2)
    bf16 = evaluate(spec, Workload(batch=8, seq=4096, precision="bf16"), ParallelPlan(dp=8), H100)
    fp8 = evaluate(spec, Workload(batch=8, seq=4096, precision="fp8"), ParallelPlan(dp=8), H100)
    assert 1.0 < bf16.step_s / fp8.step_s < 2.0  # fp8 GEMMs at twice the rate, the rest unchanged


def test_fp8_efficiency_slows_the_fp8_gemms_alone():
    """`Accelerator.fp8_efficiency` scales the efficiency of fp8 GEMMs only: an fp8 linear layer's compute time
    is divided by it, attention (bf16) and bf16 runs do not move; both evaluators agree."""
    spec = get_preset("llama3-8b")
    plan = ParallelPlan(dp=8, micro_batch=1)
    g = geometry(plan, Workload(batch=8, seq=4096, precision="fp8"))
    layer = {op.name: op for op in ops.layer_ops(spec, g)}
    full, half = (dataclasses.replace(H100.accelerator, fp8_efficiency=x) for x in (1.0, 0.5))
    for name, precision, ratio in (("qkv", "fp8", 2.0), ("flash_attention", "bf16", 1.0)):
        op = layer[name]
        slow, fast = (op_time(op.forward, op.kind, acc, precision).compute_s for acc in (half, full))
        assert slow == pytest.approx(ratio * fast, rel=1e-12)
    for precision in ("bf16", "fp8"):
        workload = Workload(batch=8, seq=4096, precision=precision)
        system = dataclasses.replace(H100, accelerator=half)
        reference = evaluate(spec, workload, plan, system).step_s
        assert evaluate_many(spec, workload, system, Candidates.from_plans([plan]))["step_s"][0] == pytest.approx(
            reference, rel=1e-9)
        unchanged = evaluate(spec, workload, plan, dataclasses.replace(H100, accelerator=full)).step_s
        assert (reference > unchanged) if precision == "fp8" else (reference == unchanged)


def test_the_search_finds_uneven_layouts_where_even_ones_cannot_exist():
    space = SearchSpace(tp=(8,), pp=(16,), cp=(1,), micro_batch=(1,), interleave=(1,), zero=(1,),
                        recompute=("none",), sequence_parallel=(True,), placements=False, shard_group=(0,))
    result = search(LLAMA_405B, TRAIN, H100, 16384, space, top_k=1)
    best, metrics = result.top[0]
    assert (best.first_stage_layers, best.last_stage_layers) == (7, 7)
    assert metrics["mem_GiB"] * GiB == pytest.approx(evaluate(LLAMA_405B, TRAIN, best, H100).memory.total, rel=1e-9)
    none = search(LLAMA_405B, TRAIN, H100, 16384, dataclasses.replace(space, uneven_stages=False), top_k=1)
    assert not none.top and none.rejected["pipeline stages hold every layer"] > 0


def test_tp_overlap_hides_only_inside_one_domain_and_ring_attention_runs_a_kernel_per_step():
    """TP8 inside a node hides part of its collectives behind the GEMMs with --tp-overlap (the chunked GEMMs and
    the unhidden chunk cost the rest, tensor_overlap.py); TP8 spread over two nodes by a cp-innermost placement
    cannot (CUDA peer-to-peer access stops at the node), so overlap changes nothing there. Context parallelism
    splits the fused attention into one kernel per ring step, each step's partial output merged in fp32."""
    workload = Workload(batch=256, seq=8192, precision="bf16", mode="train")
    base = ParallelPlan(dp=16, tp=8, pp=8, cp=2, micro_batch=1, zero=1, sequence_parallel=True, first_stage_layers=14,
                        last_stage_layers=16)
    inside, across = base, base.replace(placement=("cp", "tp", "dp", "pp"))
    for plan, hidden in ((inside, True), (across, False)):
        plain = evaluate(LLAMA_405B, workload, plan, H100).breakdown["tp_comm"]
        overlapped = evaluate(LLAMA_405B, workload, plan.replace(tp_overlap=True), H100).breakdown["tp_comm"]
        assert (overlapped < 0.9 * plain) if hidden else (overlapped == pytest.approx(plain, rel=1e-12))
    g = geometry(base, workload)
    flash, merge = ops.attention_ops(LLAMA_405B, g)
    assert flash.forward.kernels == flash.backward.kernels == 2
    # Transformer Engine's ring: one correction pass over the fp32 output per step after the first
    tokens = 8192 / 2
    assert merge.name == "cp_merge" and merge.forward.bytes == pytest.approx(8 * tokens * LLAMA_405B.q_dim / 8)
