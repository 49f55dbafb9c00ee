"""predict, plan, calibrate, compare and validate end to end: output, records, bad input (one line, exit 2)."""

import subprocess
import sys

import pytest

from stepscope.results.store import RecordStore, make_record, read_records
from tests.perfmodel.test_calibrate import KNOTS, TRUE, synthetic_points


def test_predict_prints_totals_breakdown_and_per_layer_table(cli, tmp_path):
    code, out, err = cli("predict", "--model", "gpt3-175b", "--system", "A100-80GB", "--gpus", "1024", "--tp", "8",
                         "--pp", "16", "--global-batch", "1536", "--recompute", "full", "--per-layer",
                         "--out", tmp_path)
    assert code == 0, err
    for text in ("step_s", "mfu_pct", "where the step goes", "tp_comm", "bubble", "flash_attention", "mlp x6",
                 "AR tp8"):
        assert text in out
    (record,) = read_records(tmp_path / "predict.jsonl")
    from stepscope.perfmodel.model.evaluate import evaluate
    from stepscope.spec import Workload, get_preset
    from stepscope.spec.plan import ParallelPlan
    from stepscope.spec.system import load_system

    # the options became this plan (dp = 1024 / (8 x 16)), predicted as the library predicts it, to the bit
    plan = ParallelPlan(dp=8, tp=8, pp=16, recompute="full", micro_batch=record["config"]["plan"]["micro_batch"])
    expected = evaluate(get_preset("gpt3-175b"), Workload(batch=1536, seq=2048, precision="bf16", mode="train"), plan,
                        load_system("A100-80GB"))
    assert record["config"]["plan"] == plan.to_dict() and record["metrics"]["step_s"] == expected.step_s
    assert 0 < record["metrics"]["mfu_pct"] < record["metrics"]["hfu_pct"] < 100


def test_predict_and_plan_a_mixture_of_experts_model(cli, tmp_path):
    code, out, err = cli("predict", "--model", "mixtral-8x7b", "--system", "H100-SXM", "--gpus", "64", "--pp", "4",
                         "--ep", "8", "--seq", "4096", "--global-batch", "256", "--per-layer", "--out", tmp_path)
    assert code == 0, err
    for text in ("ep_comm", "router", "dispatch", "expert_up", "combine", "A2A ep8", "moe x8"):
        assert text in out
    code, out, err = cli("predict", "--model", "deepseek-v3-gqa", "--system", "H100-SXM", "--gpus", "1024", "--pp",
                         "16", "--ep", "64", "--first-stage-layers", "3", "--last-stage-layers", "2", "--dispatcher",
                         "deepep", "--ep-overlap", "--seq", "4096", "--global-batch", "1024", "--per-layer", "--out",
                         tmp_path)
    assert code == 0, err
    assert "DSP ep64" in out and "deepep ep-overlap" in out
    code, out, err = cli("plan", "--model", "tiny-moe", "--system", "H100-SXM", "--gpus", "16", "--seq", "128",
                         "--global-batch", "64", "--ep", "2,4", "--top", "3", "--out", tmp_path)
    assert code == 0, err
    plans = [r["config"]["plan"] for r in read_records(tmp_path / "plan.jsonl")]
    assert plans and all(p["ep"] in (2, 4) for p in plans) and ("ep2 " in out or "ep4 " in out)


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3-8b", "--tp", "3"], "tp=3 does not divide n_heads=32"),
    (["--system", "H900"], "unknown system 'H900'"),
    (["--gpus", "12", "--tp", "8"], "does not divide --gpus 12"),
    (["--tp", "2,4"], "--tp takes one value, got '2,4'"),
    (["--zero", "1,2"], "--zero takes one value, got '1,2'"),
    (["--recompute", "some"], "invalid choice 'some'"),
    (["--flash", "maybe"], "choose yes or no"),
    (["--buckets", "magic"], "invalid choice 'magic'"),
    (["--seq", "4096"], "exceeds the model's context_length"),
    (["--precision", "fp16", "--system", "CPU-fp16-less"], "no such system file"),
    (["--model", "llama3-8b", "--gpus", "8", "--ep", "2"], "ep=2 needs a Mixture-of-Experts model"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "3"], "ep=3 does not divide n_experts=8"),
    (["--model", "mixtral-8x7b", "--expert-imbalance", "0.5"], "a finite number of at least 1"),
    (["--model", "mixtral-8x7b", "--expert-imbalance", "inf"], "expert_imbalance must be a finite number"),
    (["--pipeline-rounds", "0"], "invalid value '0' in --pipeline-rounds"),
    (["--pp", "2", "--global-batch", "6", "--pipeline-rounds", "4"], "pipeline_rounds=4 does not divide the 6"),
])
def test_predict_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    argv = [a.replace("CPU-fp16-less", str(tmp_path / "missing.toml")) for a in args]
    code, out, err = cli("predict", "--out", tmp_path, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "predict.jsonl").exists() or read_records(tmp_path) == []


def test_predict_with_the_ddp_bucket_planners_layout(cli, tmp_path):
    args = ("predict", "--model", "gpt2", "--gpus", "8", "--global-batch", "32", "--micro-batch", "4", "--seq", "1024",
            "--buckets", "torch", "--out", tmp_path)
    code, out, err = cli(*args, "--stack", "pytorch-ddp")
    assert code == 0, err
    (record,) = read_records(tmp_path / "predict.jsonl")
    assert record["config"]["buckets"] == "torch" and record["config"]["plan"]["stack"] == "pytorch-ddp"
    # Megatron-Core buckets its gradients its own way: DDP's planner does not describe it
    code, _, err = cli(*args, "--stack", "megatron-core")
    assert code == 2 and "--buckets torch lays out PyTorch DDP's buckets" in err and len(err.strip().splitlines()) == 1


def test_malformed_system_toml_is_one_line(cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[accelerator\n")
    code, _, err = cli("predict", "--system", path, "--out", tmp_path)
    assert code == 2 and "malformed TOML" in err and len(err.strip().splitlines()) == 1


def test_plan_prints_its_rate_and_only_feasible_plans(cli, tmp_path):
    code, out, err = cli("plan", "--model", "megatron-1.7b", "--gpus", "16", "--global-batch", "64", "--top", "3",
                         "--explain", "--out", tmp_path)
    assert code == 0, err
    assert "configs/s" in out and "top 3 feasible plans" in out and "why candidates were rejected" in out
    records = read_records(tmp_path / "plan.jsonl")
    assert [r["config"]["rank"] for r in records] == [1, 2, 3]
    assert all(r["metrics"]["mem_GiB"] <= r["metrics"]["capacity_GiB"] for r in records)
    assert records[0]["metrics"]["search_configs_per_s"] > 0


def test_plan_without_feasible_candidate_names_the_constraint(cli, tmp_path):
    code, out, err = cli("plan", "--model", "megatron-1t", "--gpus", "8", "--global-batch", "8", "--out", tmp_path)
    assert code == 2 and "memory excluded all" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("plan", "--model", "tiny", "--gpus", "8", "--out", tmp_path)
    assert code == 2 and "plan needs --global-batch" in err


def _write_step_records(folder, points):
    store = RecordStore(folder, "step").check_writable()
    for p in points:
        config = {"model": p.model.name, **p.workload.to_dict(), "attention": p.attention, "threads": 2,
                  "model_spec": p.model.to_dict()}
        metrics = {f"{phase}_ms_median": 1e3 * s for phase, s in p.phases.items()}
        metrics["gemm_TFLOPps"] = p.gemm_flops_per_s / 1e12
        store.append(make_record("step", config, metrics, env={"cpu_model": "synthetic", "threads": 2}))


def test_calibrate_writes_a_system_that_compare_uses(cli, tmp_path):
    _write_step_records(tmp_path / "measured", synthetic_points(TRUE))
    system = tmp_path / "systems" / "fitted.toml"  # a folder --system-out creates
    code, out, err = cli("calibrate", tmp_path / "measured", "--system-out", system, "--knots",
                         ",".join(map(str, KNOTS)), "--prior-weight", "0", "--out", tmp_path)
    assert code == 0, err
    assert "kernel_overhead_us" in out and "in-sample" in out and system.exists()
    code, out, err = cli("compare", tmp_path / "measured", "--system", system, "--out", tmp_path)
    assert code == 0, err
    records = read_records(tmp_path / "compare.jsonl")
    assert len(records) == len(synthetic_points())
    assert all(abs(r["metrics"][f"{phase}_error_pct"]) < 0.01 for r in records for phase in ("forward", "backward"))
    code, _, err = cli("compare", tmp_path / "measured", "--system", system, "--where", "seq=999", "--out", tmp_path)
    assert code == 2 and "no usable step records" in err
    code, _, err = cli("calibrate", tmp_path / "nowhere", "--out", tmp_path)
    assert code == 2 and "no such results file or folder" in err
    code, _, err = cli("compare", tmp_path / "measured", "--where", "seq", "--out", tmp_path)
    assert code == 2 and "malformed filter" in err
    code, _, err = cli("calibrate", tmp_path / "measured", "--prior-weight", "-1", "--out", tmp_path)
    assert code == 2 and "--prior-weight must be a finite number >= 0" in err


def test_compare_reads_real_step_records(cli, tmp_path):
    code, _, err = cli("step", "--model", "tiny", "--batch", "2", "--seq", "16", "--mode", "fwd-bwd", "--warmup", "0",
                       "--iters", "2", "--out", tmp_path)
    assert code == 0, err
    code, out, err = cli("compare", tmp_path, "--system", "CPU", "--out", tmp_path)
    assert code == 0, err
    assert "forward_error_pct" in out and "absolute error per phase" in out


def test_validate_prints_the_median_error(cli, tmp_path):
    code, out, err = cli("validate", "--out", tmp_path)
    assert code == 0, err
    assert "median absolute error" in out and "1008.0B" in out
    assert len(read_records(tmp_path / "validate.jsonl")) == 10


def test_the_performance_model_never_imports_torch():
    code = ("import sys, pkgutil, importlib, stepscope.perfmodel as pm\n"
            "for m in pkgutil.iter_modules(pm.__path__): importlib.import_module('stepscope.perfmodel.' + m.name)\n"
            "import stepscope.spec.system, stepscope.spec.plan\n"
            "from stepscope.perfmodel.validate.validate import validate; validate()\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
