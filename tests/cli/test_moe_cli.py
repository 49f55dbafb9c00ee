"""`step`, `profile` and `memory` on the tiny Mixture-of-Experts preset: records carry the expert implementation
and activated-parameter FLOPs, profile splits the `moe` category into its pieces, memory measures the step."""

import pytest

from stepscope.results.store import read_records
from stepscope.spec import get_preset

MOE = ["--model", "tiny-moe", "--batch", "2", "--seq", "16"]


def test_step_both_expert_implementations_with_activated_flops(cli, tmp_path):
    code, out, err = cli("step", *MOE, "--moe-impl", "grouped,reference", "--capacity-factor", "0,1.25",
                         "--router", "sigmoid", "--warmup", "0", "--iters", "1", "--out", tmp_path)
    assert code == 0, err
    records = read_records(tmp_path / "step.jsonl")
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    spec = get_preset("tiny-moe")
    for record in records:
        forward_flops = 2 * 16 * spec.forward_flops_per_token(16)  # 2N with N = activated matmul weights
        metrics = record["metrics"]
        assert metrics["forward_TFLOPps"] * metrics["forward_ms_median"] * 1e9 == pytest.approx(forward_flops)
    assert {r["config"]["moe_impl"] for r in records} == {"grouped", "reference"}
    # each point says which expert implementation it timed, in its title and in the sweep summary
    assert out.count("sdpa experts grouped (") == 2 and out.count("sdpa experts reference (") == 2
    assert "moe_impl" in out
    # the performance model reads measured MoE step records: calibrate fits to them, compare predicts them
    code, out, err = cli("calibrate", tmp_path, "--system-out", tmp_path / "cal" / "cpu.toml",
                         "--out", tmp_path / "cal")
    assert code == 0, err
    assert "in-sample" in out and (tmp_path / "cal" / "cpu.toml").exists()
    code, out, err = cli("compare", tmp_path, "--system", tmp_path / "cal" / "cpu.toml", "--out", tmp_path / "cal")
    assert code == 0, err
    compared = read_records(tmp_path / "cal" / "compare.jsonl")
    assert compared and all(r["config"]["model_spec"]["n_experts"] == 4 for r in compared)
    # every measured record compared: its step = the sum of its phase medians, the error by its definition, and
    # one prediction per configuration the model sees (it has no expert implementation: grouped and reference
    # get the same), which differs between the two capacity factors
    phases = ("forward", "backward", "optimizer")
    measured = sorted((r["config"]["model_spec"]["capacity_factor"],
                       sum(r["metrics"][f"{phase}_ms_median"] for phase in phases)) for r in records)
    got = sorted((r["config"]["model_spec"]["capacity_factor"], r["metrics"]["step_measured_ms"]) for r in compared)
    assert [cf for cf, _ in got] == [cf for cf, _ in measured]
    assert [ms for _, ms in got] == pytest.approx([ms for _, ms in measured], rel=1e-9)
    predicted: dict[float, set[float]] = {}
    for r in compared:
        m = r["metrics"]
        assert m["step_error_pct"] == pytest.approx(100 * (m["step_predicted_ms"] / m["step_measured_ms"] - 1))
        predicted.setdefault(r["config"]["model_spec"]["capacity_factor"], set()).add(m["step_predicted_ms"])
    assert all(len(values) == 1 for values in predicted.values()) and len(set.union(*predicted.values())) == 2
    code, _, err = cli("step", *MOE, "--moe-impl", "loop", "--out", tmp_path)
    assert code == 2 and "invalid choice 'loop'" in err
    code, _, _ = cli("step", "--model", "tiny", "--batch", "2", "--seq", "16", "--warmup", "0", "--iters", "1",
                     "--out", tmp_path / "dense")
    assert "moe_impl" not in read_records(tmp_path / "dense" / "step.jsonl")[0]["config"]


def test_profile_has_a_moe_category_split_into_pieces(cli, tmp_path):
    code, out, err = cli("profile", *MOE, "--warmup", "1", "--iters", "1", "--out", tmp_path)
    assert code == 0, err
    assert "Mixture-of-Experts pieces per step" in out
    categories = {(r["config"]["phase"], r["config"]["category"]): r["metrics"]["time_ms"]
                  for r in read_records(tmp_path / "profile-category.jsonl")}
    train = {category: ms for (phase, category), ms in categories.items() if phase == "train"}
    assert train["moe"] > 0 and train["other"] <= 0.05 * sum(train.values())
    pieces = {(r["config"]["phase"], r["config"]["piece"]) for r in read_records(tmp_path / "profile-moe.jsonl")}
    assert {("forward", p) for p in ("router", "dispatch", "experts", "combine", "shared")} <= pieces
    assert {("backward", "experts"), ("backward", "router")} <= pieces  # backward nodes keep their forward piece
    assert read_records(tmp_path / "profile.jsonl")[0]["metrics"]["train_moe_pct"] > 0


def test_memory_measures_the_moe_step(cli, tmp_path):
    code, out, err = cli("memory", *MOE, "--mode", "train", "--out", tmp_path, "--plot-dir", tmp_path / "plots")
    assert code == 0, err
    metrics = read_records(tmp_path / "memory.jsonl")[0]["metrics"]
    weights_MiB = get_preset("tiny-moe").param_count() * 4 / 2**20
    # after the step (gradients set to None): weights and two AdamW moments
    assert metrics["optimizer_current_MiB"] >= 3 * weights_MiB * 0.99 and metrics["peak_MiB"] > 0
