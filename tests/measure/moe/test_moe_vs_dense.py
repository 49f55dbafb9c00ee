"""`stepscope step --vs-dense`: the dense equivalent's width, the result's figures from hand-made samples (medians,
per-round ratios, shares of the block), one tiny run end to end with its record, and bad input."""

from __future__ import annotations

import pytest

from stepscope.measure.moe.benchmark import MoEDenseResult
from stepscope.measure.moe.config import MoEDenseConfig, dense_equivalent
from stepscope.measure.step.config import StepConfig
from stepscope.results.store import read_records
from stepscope.spec import Workload, get_preset

TINY = ["--model", "tiny-moe", "--batch", "1", "--seq", "16", "--warmup", "0", "--iters", "3"]


def test_the_dense_equivalent_has_the_activated_flops_but_the_router():
    spec = get_preset("qwen3-30b-a3b", n_layers=2)
    dense = dense_equivalent(spec)
    assert dense.d_ff == 8 * 768 and not dense.is_moe and dense.n_layers == 2 and dense.d_model == spec.d_model
    router = 2 * spec.d_model * spec.n_experts * spec.n_layers  # forward FLOPs per token of the two routers
    assert spec.forward_flops_per_token(4096) - dense.forward_flops_per_token(4096) == router
    config = MoEDenseConfig(StepConfig(model=spec, workload=Workload(seq=4096)))
    assert config.flops_ratio == pytest.approx(1 + router / dense.forward_flops_per_token(4096), rel=1e-12)
    shared = dense_equivalent(get_preset("tiny-moe"))  # top-2 of width 128 and one shared expert
    assert shared.d_ff == 3 * 128


def _result(mode: str = "fwd-bwd") -> MoEDenseResult:
    """Three rounds with round numbers: per-round ratios differ from the ratio of medians on purpose."""
    rounds = {"moe step": [(3, 5), (4, 4), (10, 10)], "dense step": [(2, 3), (1, 3), (4, 4)],
              "moe block": [(4, 6), (5, 5), (3, 7)], "reference block": [(8, 1), (5, 1), (9, 1)],
              "dense mlp": [(2, 2), (2, 3), (2, 2)], "router": [(1, 1), (1, 0), (1, 1)],
              "permute": [(0.5, 0.5), (0.5, 0.5), (0.5, 0.5)], "experts": [(3, 4), (3, 3), (2, 5)],
              "combine": [(0.25, 0.25), (0.25, 0.25), (0.25, 0.25)]}
    samples = {label: [{"forward": f, "backward": b} for f, b in values] for label, values in rounds.items()}
    step = StepConfig(model=get_preset("tiny-moe"), workload=Workload(batch=1, seq=16, mode=mode), iters=3)
    return MoEDenseResult(MoEDenseConfig(step), samples, max_error=1e-6, gemm_kind="grouped_mm", threads=2,
                          device="cpu", load_average=(0.5, 0.7))


def test_figures_are_medians_per_round_ratios_and_shares_of_the_block():
    result = _result()
    forward, backward, step = result.step_rows()
    assert step["moe_ms"] == 8000.0 and step["dense_ms"] == 5000.0  # medians of 8, 8, 20 and 5, 4, 8
    assert step["moe_over_dense"] == pytest.approx(2.0)  # per-round 8/5, 8/4, 20/8: median 2, not 8000/5000
    assert forward["phase"] == "forward" and forward["moe_over_dense"] == pytest.approx(2.5)  # 3/2, 4/1, 10/4
    assert backward["moe_over_dense"] == pytest.approx(5 / 3)  # 5/3, 4/3, 10/4
    rates = result.rates()  # 16 tokens in the median step of 8 s and 5 s
    assert rates["moe step"]["tokens_per_s"] == pytest.approx(2.0) and rates["dense step"]["tokens_per_s"] == 3.2
    blocks = {row["candidate"]: row for row in result.block_rows()}
    assert blocks["moe block"]["total_ms"] == 10000.0 and blocks["moe block"]["pct_of_moe_block"] == 100.0
    assert blocks["experts"]["pct_of_moe_block"] == pytest.approx(70.0)  # median 7 of the block's 10
    assert blocks["router"]["pct_of_moe_block"] == pytest.approx(20.0)
    assert blocks["reference block"]["pct_of_moe_block"] is None
    assert blocks["dense mlp"]["vs_dense_mlp"] == 1.0 and blocks["moe block"]["vs_dense_mlp"] == pytest.approx(2.5)
    metrics = result.metrics()
    assert metrics["block_forward_vs_reference_median"] == pytest.approx(4 / 8)  # 4/8, 5/5, 3/9
    assert metrics["experts_pct_of_block"] == pytest.approx(70.0) and metrics["step_ratio_median"] == 2.0
    assert result.verdict().startswith("MoE step / dense step: 2.000")


def test_one_tiny_run_end_to_end(cli, tmp_path):
    code, out, err = cli("step", "--vs-dense", *TINY, "--out", tmp_path)
    assert code == 0, err
    (record,) = read_records(tmp_path / "moe-vs-dense.jsonl")
    assert record["status"] == "ok" and record["config"]["dense_d_ff"] == 384
    metrics = record["metrics"]
    assert metrics["max_abs_error"] <= 1e-5 and metrics["moe_step_n"] == 3
    for piece in ("router", "permute", "experts", "combine", "shared"):
        assert metrics[f"{piece}_forward_ms_median"] > 0 and metrics[f"{piece}_backward_ms_median"] > 0
    assert metrics["step_ratio_median"] > 0 and "optimizer" in out and "moe_over_dense" in out
    assert metrics["moe_step_tokens_per_s"] == pytest.approx(16 / (metrics["moe_step_ms_median"] / 1e3))
    assert "grouped block equals the reference" in out


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny"], "has no experts"),
    (["--ab"], "two different comparisons"),
    (["--seq", "16,32"], "measures one MoE setup"),
    (["--resume"], "--resume does not apply"),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, args, message):
    code, out, err = cli("step", "--vs-dense", *TINY, *args, "--out", tmp_path)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "moe-vs-dense.jsonl").exists()
