"""`stepscope op-rates` times the ops the performance model times: its shapes carry the model's FLOPs, op by op;
it writes a record per op and variant, and refuses a bad layout before any output."""

import pytest
import torch

from stepscope.measure.op_rates import shapes
from stepscope.measure.op_rates.benchmark import run_op_rates
from stepscope.measure.op_rates.config import OpRatesConfig
from stepscope.perfmodel.calibrate.rates import read_rates
from stepscope.perfmodel.model import ops
from stepscope.perfmodel.model.layout import plan_geometry as geometry
from stepscope.perfmodel.model.ops_moe import moe_block
from stepscope.results.store import read_records
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
    measured = shapes.dense_ops("llama3-70b", 4, 4096)
    assert len(measured) == 15
    for name in ("qkv", "attn_out", "mlp_up", "mlp_down", "logits"):
        passes = {op.direction: op.flops for op in measured if op.op == name}
        assert passes["forward"] == pytest.approx(modelled[name].forward.flops, rel=1e-12)
        assert passes["input-grad"] + passes["weight-grad"] == pytest.approx(modelled[name].backward.flops, rel=1e-12)


def test_attention_and_expert_gemms_carry_the_models_flops():
    modelled = model_ops("llama3-405b", ParallelPlan(tp=8, sequence_parallel=True), 8192)
    forward, backward = shapes.attention_ops("llama3-405b", 8, 8192)
    assert forward.flops == pytest.approx(modelled["flash_attention"].forward.flops, rel=1e-12)
    assert backward.flops == pytest.approx(modelled["flash_attention"].backward.flops, rel=1e-12)
    # Qwen3-30B-A3B with EP 16 over 16 GPUs, 4,096 tokens each, balanced: 8 local experts
    modelled = model_ops("qwen3-30b-a3b", ParallelPlan(dp=16, ep=16), 4096)
    up, down = shapes.moe_ops("qwen3-30b-a3b", 16, 4096)
    assert up.groups == 8 and up.m == 4096 * 8 // 8
    assert up.flops == pytest.approx(modelled["expert_up"].forward.flops, rel=1e-12)
    assert down.flops == pytest.approx(modelled["expert_down"].forward.flops, rel=1e-12)


def test_a_cpu_run_records_every_row_and_the_weighted_ratio(tmp_path):
    config = OpRatesConfig(dense=("tiny:1:64",), cubes=(32,), moe=("tiny-moe:1:64",), sdpa=(), system="H100-SXM",
                           rounds=1, min_batch_s=0.001, preheat_s=0.01, device="cpu")
    result = run_op_rates(config, tmp_path)
    grouped = 2 if hasattr(torch, "_grouped_mm") else 1
    assert len(result.rows) == 15 + 1 + 2 * grouped  # no fp8 on a CPU
    assert {(r["op"], r["variant"]) for r in result.rows if r["family"] == "moe"} >= {("expert_up", "bmm")}
    (summary,) = result.summary
    rows = [r for r in result.rows if r["family"] == "dense"]
    real_s = sum(r["flops"] / (r["measured_TFLOPps"] * 1e12) for r in rows)
    model_s = sum(r["flops"] / (r["model_TFLOPps"] * 1e12) for r in rows)
    assert summary["measured_time_over_model"] == pytest.approx(real_s / model_s, rel=1e-9)
    records = read_records(tmp_path)
    assert len(records) == len(result.rows) + len(result.unsupported)
    assert {r["kind"] for r in records} == {"op-rates"}
    qkv = next(r for r in records if r["config"]["op"] == "qkv" and r["config"]["direction"] == "forward")
    assert qkv["config"]["m"] == 64 and qkv["metrics"]["flops"] == 2.0 * 64 * 64 * 192  # tiny: d 64, 4 heads
    assert len(read_rates([tmp_path])) == len(result.rows)  # what calibrate --rates reads


@pytest.mark.parametrize("args, message", [
    (["--dense", "nope:1:8"], "dense layout 'nope:1:8'"), (["--dense", "llama3-8b"], "is not model:tp:tokens"),
    (["--cubes", "abc"], "invalid value 'abc'"), (["--system", "H900"], "H900"),
    (["--moe", "tiny-moe:0:8"], "is not model:ep:tokens"), (["--rounds", "0"], "--rounds")])
def test_bad_settings_are_one_line_exit_2_and_leave_nothing(cli, tmp_path, args, message):
    code, _, err = cli("op-rates", *args, "--preheat-s", "0", "--out", tmp_path / "out")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
