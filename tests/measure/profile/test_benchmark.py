"""`profile_step` on the tiny model: categories cover the time, the trace holds the phase ranges, the naive
attention pieces carry the closed-form FLOPs and bytes, the timer table lines up with the phases."""

import json

import pytest

from stepscope.measure.profile.benchmark import profile_step
from stepscope.measure.profile.config import ProfileConfig
from stepscope.measure.profile.events import PHASE_GROUPS
from stepscope.measure.step.config import StepConfig
from stepscope.spec import Workload, get_preset

BATCH, SEQ = 2, 32


def profile(spec, attention="sdpa", mode="train", precision="fp32", trace=None):
    config = ProfileConfig(step=StepConfig(model=spec, workload=Workload(batch=BATCH, seq=SEQ, mode=mode,
                                                                         precision=precision),
                                           attention=attention, device="cpu", warmup=1, iters=2), active=2)
    return profile_step(config, trace)


@pytest.fixture(scope="module")
def naive(tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "trace.json"
    return profile(get_preset("tiny"), attention="naive", trace=trace)


def category_totals(result, group):
    table = next(t for t in result.tables() if t.kind == "profile-category" and t.rows[0]["phase"] == group)
    return {row["category"]: row["time_ms"] for row in table.rows}


@pytest.mark.parametrize("variant", ["naive-llama", "sdpa-gpt2-bf16"])
def test_categories_cover_at_least_95_percent_of_the_time(naive, variant):
    if variant == "naive-llama":
        result = naive
    else:  # LayerNorm, GELU, learned positions, biases, tied embeddings, autocast, fused attention
        result = profile(get_preset("tiny", norm="layer", mlp="gelu", positions="learned", tie_embeddings=True,
                                    attn_bias=True, mlp_bias=True), precision="bf16")
    for group in ("fwd", "fwd-bwd", "train"):
        totals = category_totals(result, group)
        assert sum(totals.values()) > 0
        assert totals["other"] <= 0.05 * sum(totals.values()), (group, totals)
    train = category_totals(result, "train")
    assert train["matmul"] > 0 and train["optimizer"] > 0 and train["normalization"] > 0
    if variant == "sdpa-gpt2-bf16":
        assert train["attention"] > 0
    else:
        assert train["softmax"] > 0 and "attention" not in train  # naive attention is matmuls and a softmax


def test_work_sums_match_the_phase_ranges_and_groups_accumulate(naive):
    steps = naive.config.active
    ranges = {phase: sum(r.seconds for r in naive.ranges if r.phase == phase) / steps
              for phase in ("forward", "backward", "optimizer")}
    for phase, ranged in ranges.items():
        in_ops = sum(w.seconds for w in naive.work if w.phase == phase) / steps
        assert 0 < in_ops <= ranged * 1.001  # op time happens inside the range
    totals = {group: sum(category_totals(naive, group).values()) for group in PHASE_GROUPS}
    assert totals["fwd"] < totals["fwd-bwd"] < totals["train"]
    assert len([r for r in naive.ranges if r.phase == "forward"]) == steps  # only the active steps


def test_backward_of_a_composite_norm_stays_normalization(naive):
    # RMSNorm is a composite (pow, mean, rsqrt, mul); its backward nodes are generic MulBackward0 etc.
    backward = [w for w in naive.work if w.phase == "backward"]
    norm_ops = {w.op for w in backward if w.category == "normalization"}
    assert {"MulBackward0", "PowBackward0"} & norm_ops, norm_ops
    assert any(w.op == "MulBackward0" and w.category == "elementwise" for w in backward)  # SwiGLU / rotary


def test_trace_is_json_with_the_phase_ranges(naive):
    trace = json.loads(naive.trace_path.read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"stepscope.forward", "stepscope.backward", "stepscope.optimizer"} <= names
    assert sum(1 for e in trace["traceEvents"] if e.get("name") == "stepscope.forward") == naive.config.active


def test_naive_attention_pieces_have_closed_form_flops_and_bytes(naive):
    spec = naive.config.step.model
    b, h, s, d, layers, e = BATCH, spec.n_heads, SEQ, spec.head_dim, spec.n_layers, 4
    table = next(t for t in naive.tables() if t.kind == "profile-attention")
    rows = {row["piece"]: row for row in table.rows}
    assert set(rows) == {"score matmul", "softmax", "value matmul"}
    assert rows["score matmul"]["flops"] == layers * 2 * b * h * s * s * d
    assert rows["value matmul"]["flops"] == layers * 2 * b * h * s * s * d
    assert rows["softmax"]["flops"] == layers * 5 * b * h * s * s
    assert rows["score matmul"]["bytes"] == layers * (2 * b * h * s * d + b * h * s * s) * e
    assert rows["softmax"]["bytes"] == layers * 2 * b * h * s * s * e
    assert rows["value matmul"]["bytes"] == layers * (b * h * s * s + 2 * b * h * s * d) * e
    for row in rows.values():
        assert row["calls_per_step"] == layers and row["time_ms"] > 0 and row["TFLOPps"] > 0 and row["GBps"] > 0
    assert rows["softmax"]["FLOP_per_byte"] < 1 < rows["score matmul"]["FLOP_per_byte"]


def test_timer_table_and_summary_metrics(naive):
    table = next(t for t in naive.tables() if t.kind == "profile-timer")
    rows = {row["phase"]: row for row in table.rows}
    assert list(rows) == ["forward", "backward", "optimizer", "step"]
    assert rows["step"]["in_ops_ms"] == pytest.approx(sum(rows[p]["in_ops_ms"] for p in
                                                          ("forward", "backward", "optimizer")))
    for row in rows.values():
        assert row["timer_ms"] > 0 and row["gap_ms"] == pytest.approx(row["profiled_range_ms"] - row["in_ops_ms"])
        assert row["gap_ms"] >= 0  # the same profiled steps: time in ops never exceeds the range around them
        assert row["profiler_overhead_ms"] == pytest.approx(row["profiled_range_ms"] - row["timer_ms"])
    metrics = naive.metrics()
    share = {row["phase"]: row for row in next(t for t in naive.tables() if t.kind == "profile-share").rows}
    assert metrics["fwd_matmul_pct"] == pytest.approx(share["fwd"]["matmul_pct"])
    assert 0 < metrics["train_matmul_pct"] < 100 and metrics["train_other_pct"] < 5


def test_forward_only_mode_has_only_the_forward_tables():
    result = profile(get_preset("tiny", n_layers=1), mode="fwd")
    kinds = [(t.kind, t.rows[0].get("phase")) for t in result.tables()]
    assert ("profile-category", "fwd") in kinds and not any(phase == "train" for _, phase in kinds)
    assert [r["phase"] for r in next(t for t in result.tables() if t.kind == "profile-timer").rows] == \
        ["forward", "step"]
