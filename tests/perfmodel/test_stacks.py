"""Training stacks (spec/stack.py) and the costs that differ by stack: context parallelism, overlapped tensor
parallelism, pipeline exchanges, the fused-attention kernel. Hand computations on one layer's ops."""

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.model.collectives import all_gather, p2p, reduce_scatter
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.model.layout import plan_geometry
from stepscope.perfmodel.model.op_types import Geometry
from stepscope.perfmodel.model.ops import CP_MERGE_PASSES, attention_ops
from stepscope.perfmodel.model.rates import on_stack, op_time
from stepscope.perfmodel.model.terms import PIPELINE_SYNC_S
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.stack import list_stacks, load_stack, stack_to_toml
from stepscope.spec.system import load_system

H100 = load_system("H100-SXM")
LLAMA = get_preset("llama3-8b")


def test_every_stack_preset_loads_round_trips_and_an_unknown_one_is_one_line(tmp_path):
    assert {"megatron-core", "megatron-lm-2022", "fsdp", "torchtitan", "pytorch-ddp"} <= set(list_stacks())
    for name in list_stacks():
        stack = load_stack(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(stack_to_toml(stack, header="copied"))
        assert load_stack(str(path)) == stack and stack.compute_efficiency == 1.0  # no preset carries a fitted factor
    with pytest.raises(UsageError, match="unknown stack 'nope'; presets: "):
        ParallelPlan(stack="nope")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ndata_parallel = "magic"\n')
    with pytest.raises(UsageError, match="data_parallel in .* must be one of megatron, ddp, fsdp, after-backward"):
        load_stack(str(bad))


def flash_op(stack: str, cp: int):
    g = Geometry(micro_batch=1, seq=32768, act_bytes=2, cp=cp, context_parallel=load_stack(stack).context_parallel)
    return attention_ops(LLAMA, g)


def test_transformer_engines_ring_hides_each_kv_send_behind_its_step():
    """cp 4: three sends of one rank's K and V (8,192 tokens x 1,024 K/V width x 2 tensors x 2 bytes) each behind
    a quarter of the attention; backward sends K/V and their gradients; one fp32 merge pass per step after the
    first."""
    (flash, merge) = flash_op("megatron-core", 4)
    (send,) = flash.forward.comms
    block = 2 * 8192 * LLAMA.kv_dim * 2
    assert send.kind == "ring-step" and send.bytes == pytest.approx(block) and send.repeats == 3
    assert send.window_share == pytest.approx(0.25) and flash.forward.kernels == 4
    assert flash.backward.comms[0].bytes == pytest.approx(2 * block)
    compute = op_time(flash.forward, "attention", H100.accelerator, "bf16").compute_s
    one = p2p(block, True, H100.network)  # a cp group inside one node: NVLink
    assert send.exposed(4, H100.network, compute, False) == pytest.approx(3 * max(0.0, one - compute / 4))
    assert merge.forward.bytes == pytest.approx(CP_MERGE_PASSES["p2p-ring"] * 3 * 8 * 8192 * LLAMA.q_dim)


def test_llama3s_all_gather_is_exposed_and_pytorchs_repeats_kv_to_every_head():
    (flash, ) = flash_op("llama3", 4)  # no merges: two kernels on the gathered K/V
    gathered = 2 * 32768 * LLAMA.kv_dim * 2
    fwd, = flash.forward.comms
    assert fwd.kind == "all-gather" and fwd.bytes == pytest.approx(gathered) and not fwd.hides(4, True)
    assert [c.kind for c in flash.backward.comms] == ["all-gather", "reduce-scatter"] and flash.forward.kernels == 2
    assert fwd.exposed(4, H100.network, 1.0, True) == pytest.approx(all_gather(gathered, 4, 4, H100.network))
    (flash, merge) = flash_op("torchtitan", 4)
    fwd, = flash.forward.comms
    repeat = LLAMA.n_heads / LLAMA.n_kv_heads
    assert fwd.bytes == pytest.approx(gathered * repeat) and fwd.window_share == pytest.approx(0.25)
    compute = 1e-3
    assert fwd.exposed(4, H100.network, compute, False) == pytest.approx(
        max(0.0, all_gather(gathered * repeat, 4, 4, H100.network) - compute / 4))
    assert merge.forward.kernels == CP_MERGE_PASSES["torch-all-gather"] * 3
    assert reduce_scatter(gathered, 1, 1, H100.network) == 0.0


def test_overlapped_tensor_parallelism_gains_less_than_its_whole_collective():
    """Async TP cannot hide the whole TP exchange: the chunked GEMMs and the chunk that cannot hide keep the gain
    below the no-overlap TP time, under Transformer Engine's decomposition and PyTorch's alike."""
    workload = Workload(batch=64, seq=8192, precision="bf16", mode="fwd-bwd")
    plain = ParallelPlan(dp=8, tp=8, micro_batch=1, sequence_parallel=True)
    steps = {}
    for stack in ("megatron-core", "torchtitan"):
        base = evaluate(get_preset("llama3-70b"), workload, plain.replace(stack=stack), H100)
        overlapped = evaluate(get_preset("llama3-70b"), workload, plain.replace(stack=stack, tp_overlap=True), H100)
        assert 0 < base.step_s - overlapped.step_s < base.breakdown["tp_comm"]
        steps[stack] = base.step_s / overlapped.step_s
    assert min(steps.values()) > 1.0 and steps["megatron-core"] != steps["torchtitan"]
    # without sequence parallelism an all-reduce never hides
    no_sp = plain.replace(sequence_parallel=False)
    assert (evaluate(LLAMA, workload, no_sp.replace(tp_overlap=True), H100).breakdown["tp_comm"]
            == pytest.approx(evaluate(LLAMA, workload, no_sp, H100).breakdown["tp_comm"]))


def test_pipeline_exchanges_by_schedule():
    """Plain 1F1B: every exchange shows with a device sync after it; Megatron-Core's interleaved schedule hides
    them but for one send per stage boundary in the fill and in the drain."""
    workload = Workload(batch=32, seq=4096, precision="bf16", mode="fwd-bwd")
    plan = ParallelPlan(pp=4, micro_batch=1)
    one = p2p(4096 * LLAMA.d_model * 2, True, H100.network)  # 4 stages in one node
    m = 32
    assert evaluate(LLAMA, workload, plan, H100).breakdown["pp_comm"] == pytest.approx(2 * m * (one + PIPELINE_SYNC_S))
    interleaved = evaluate(LLAMA, workload, plan.replace(interleave=2), H100)
    assert interleaved.breakdown["pp_comm"] == pytest.approx(2 * 3 * one)
    synchronous = evaluate(LLAMA, workload, plan.replace(interleave=2, stack="fsdp"), H100)
    assert synchronous.breakdown["pp_comm"] == pytest.approx(2 * m * 2 * (one + PIPELINE_SYNC_S))


def test_a_flashattention_2_stack_runs_attention_at_its_measured_rate():
    acc = H100.accelerator
    assert on_stack(H100, load_stack("torchtitan")).accelerator.flash_efficiency == acc.flash2_efficiency < \
        acc.flash_efficiency
    assert on_stack(H100, load_stack("megatron-core")) == H100
    g = plan_geometry(ParallelPlan(), Workload(batch=1, seq=8192))
    (flash,) = [op for op in attention_ops(LLAMA, g) if op.name == "flash_attention"]
    fa3, fa2 = (op_time(flash.forward, "attention", s.accelerator, "bf16").compute_s
                for s in (H100, on_stack(H100, load_stack("torchtitan"))))
    assert fa2 == pytest.approx(fa3 * acc.flash_efficiency / acc.flash2_efficiency)
