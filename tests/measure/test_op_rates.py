"""`measure.op_rates` times the ops the performance model times: its shapes carry the model's FLOPs, op by op."""

import pytest
import torch

from stepscope.measure import op_rates
from stepscope.perfmodel.model import ops
from stepscope.perfmodel.model.layout import plan_geometry as geometry
from stepscope.perfmodel.model.ops_moe import moe_block
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan


def model_ops(model: str, plan: ParallelPlan, seq: int) -> dict:
    g = geometry(plan, Workload(batch=plan.dp * plan.micro_batch, seq=seq, precision="bf16"))
    spec = get_preset(model)
    return {op.name: op for op in ops.layer_ops(spec, g) + ops.head_ops(spec, g)
            + (moe_block(spec, g) if spec.is_moe else [])}


def test_dense_gemms_carry_the_models_flops_in_all_three_passes():
    # Llama 3 70B under dgxc's TP 4, CP 2 at 8K tokens: 4,096 tokens per GPU
    modelled = model_ops("llama3-70b", ParallelPlan(tp=4, cp=2, sequence_parallel=True), 8192)
    measured = op_rates.dense_ops("llama3-70b", 4, 4096)
    assert len(measured) == 15
    for name in ("qkv", "attn_out", "mlp_up", "mlp_down", "logits"):
        passes = {op.direction: op.flops for op in measured if op.op == name}
        assert passes["forward"] == pytest.approx(modelled[name].forward.flops, rel=1e-12)
        assert passes["input-grad"] + passes["weight-grad"] == pytest.approx(modelled[name].backward.flops, rel=1e-12)


def test_attention_and_expert_gemms_carry_the_models_flops():
    modelled = model_ops("llama3-405b", ParallelPlan(tp=8, sequence_parallel=True), 8192)
    forward, backward = op_rates.attention_ops("llama3-405b", 8, 8192)
    assert forward.flops == pytest.approx(modelled["flash_attention"].forward.flops, rel=1e-12)
    assert backward.flops == pytest.approx(modelled["flash_attention"].backward.flops, rel=1e-12)
    # Qwen3-30B-A3B with EP 16 over 16 GPUs, 4,096 tokens each, balanced: 8 local experts
    modelled = model_ops("qwen3-30b-a3b", ParallelPlan(dp=16, ep=16), 4096)
    up, down = op_rates.moe_ops("qwen3-30b-a3b", 16, 4096)
    assert up.groups == 8 and up.m == 4096 * 8 // 8
    assert up.flops == pytest.approx(modelled["expert_up"].forward.flops, rel=1e-12)
    assert down.flops == pytest.approx(modelled["expert_down"].forward.flops, rel=1e-12)


def test_a_cpu_sweep_gives_every_row_and_the_weighted_ratio():
    small = op_rates.dense_ops("tiny", 1, 64) + [op_rates.MatrixOp("cube", "-", "matmul", "forward", 32, 32, 32)]
    grouped = [op_rates.MatrixOp("moe", "tiny", "expert_up", "forward", 16, 32, 32, 2)]
    result = op_rates.measure(small + grouped, "H100-SXM", 1, 0.001, 0.01, torch.device("cpu"))
    by_variant = {(r["op"], r["direction"], r["variant"]) for r in result["rows"]}
    assert len(result["rows"]) == 16 + (2 if hasattr(torch, "_grouped_mm") else 1)  # no fp8 on a CPU
    assert ("expert_up", "forward", "bmm") in by_variant
    (summary,) = result["summary"]
    rows = [r for r in result["rows"] if r["family"] == "dense"]
    real_s = sum(r["flops"] / (r["measured_TFLOPps"] * 1e12) for r in rows)
    model_s = sum(r["flops"] / (r["model_TFLOPps"] * 1e12) for r in rows)
    assert summary["measured_time_over_model"] == pytest.approx(real_s / model_s, rel=1e-9)


def test_bad_layouts_are_one_line_and_exit_2(capsys):
    for argv in (["--dense", "nope:1:8"], ["--dense", "llama3-8b"], ["--cubes", "abc"], ["--system", "H900"]):
        assert op_rates.main([*argv, "--preheat", "0"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
