"""`stepscope step` end to end on the tiny model: every mode and precision, sweeps, bad input, resume."""

import csv
import io
import subprocess

import pytest

from stepscope.results.store import read_records
from stepscope.spec.model import ModelSpec
from tests.conftest import STEPSCOPE, interrupt_sweep, subprocess_env

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--warmup", "0", "--iters", "2"]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_mode_runs_and_records_are_well_formed(cli, tmp_path, precision):
    # 3 iterations: with 2 the median is the mean, and a rate from the wrong one would pass
    code, out, err = cli("step", *TINY, "--iters", "3", "--mode", "fwd,fwd-bwd,train", "--precision", precision,
                         "--out", tmp_path)
    assert code == 0, err
    records = read_records(tmp_path / "step.jsonl")
    assert [r["config"]["mode"] for r in records] == ["fwd", "fwd-bwd", "train"]
    for record in records:
        assert record["status"] == "ok" and record["config"]["precision"] == precision
        metrics = record["metrics"]
        assert metrics["step_ms_median"] > 0 and metrics["step_gemm_fraction"] > 0
        _check_rates(record)
        assert {"torch", "cpu_model", "cores", "threads", "hostname", "utc_time", "command", "git_sha",
                "stepscope_version", "device_name"} <= set(record["env"])
    train = records[-1]["metrics"]
    assert {"forward_ms_median", "backward_ms_median", "optimizer_ms_median"} <= set(train)
    assert "phase" in out and "optimizer" in out


def _check_rates(record):
    """Rates from the medians and the FLOP convention (spec/model.py): a forward token costs 2N + 2·L·s·d
    with causal attention, backward twice the forward; TFLOP/s = phase FLOPs / median, tokens/s = tokens /
    the step's median, the GEMM fraction = the step's rate / the measured GEMM rate."""
    config, metrics = record["config"], record["metrics"]
    spec = ModelSpec(**config["model_spec"])
    tokens = config["batch"] * config["seq"]
    forward = tokens * (2 * spec.matmul_params() + 2 * spec.n_layers * config["seq"] * spec.d_model)
    flops = {"forward": forward, "backward": 2 * forward, "step": forward * (1 if config["mode"] == "fwd" else 3)}
    for phase, phase_flops in flops.items():
        if f"{phase}_ms_median" in metrics:
            rate = phase_flops / (metrics[f"{phase}_ms_median"] / 1e3) / 1e12
            assert metrics[f"{phase}_TFLOPps"] == pytest.approx(rate, rel=1e-9), phase
    assert metrics["step_flops"] == pytest.approx(flops["step"], rel=1e-12)
    assert metrics["step_tokens_per_s"] == pytest.approx(tokens / (metrics["step_ms_median"] / 1e3), rel=1e-9)
    assert metrics["step_gemm_fraction"] == pytest.approx(metrics["step_TFLOPps"] / metrics["gemm_TFLOPps"], rel=1e-9)


def test_sweep_csv_overrides_threads_and_naive_attention(cli, tmp_path):
    code, out, err = cli("step", *TINY, "--n-layers", "1,2", "--attention", "naive", "--threads", "1",
                         "--format", "csv", "--out", tmp_path)
    assert code == 0, err
    assert out.splitlines()[0].startswith("model,n_layers,batch,seq")  # the swept field is a column
    rows = list(csv.DictReader(io.StringIO(out)))  # one header, every row aligned under it
    assert len(rows) == 8 and {row["phase"] for row in rows} == {"forward", "backward", "optimizer", "step"}
    assert all(float(row["median_ms"]) > 0 and row["threads"] == "1" for row in rows)
    records = read_records(tmp_path)
    assert [r["config"]["model_spec"]["n_layers"] for r in records] == [1, 2]
    assert all(r["metrics"]["threads"] == 1 and r["env"]["threads"] == 1 for r in records)


def test_show_renders_stored_records(cli, tmp_path):
    cli("step", *TINY, "--seq", "8,16", "--out", tmp_path)
    code, out, _ = cli("show", tmp_path, "--format", "md", "--columns", "seq,step_ms_median")
    assert code == 0 and out.splitlines()[0] == "| seq | step_ms_median |"
    code, out, _ = cli("show", tmp_path / "step.jsonl", "--group-by", "seq")
    assert code == 0 and "seq=8" in out and "seq=16" in out


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt5"], "unknown model preset"),
    (["--n-layer", "2"], "unrecognized arguments"),
    (["--n-layers", "two"], "invalid value 'two' for --n-layers"),
    (["--n-heads", "5"], "does not divide d_model"),
    (["--seq", "4096"], "exceeds the model's context_length"),
    (["--seq", "128,,256"], "malformed list"),
    (["--batch", "x"], "invalid value 'x' in --batch"),
    (["--batch", "100000000000000000000"], "invalid value '100000000000000000000' in --batch"),  # > int64
    (["--precision", "fp8"], "invalid choice 'fp8'"),
    (["--device", "cuda"], "no CUDA GPU"),
    (["--attention", "magic"], "unknown attention backend"),
])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    base = {"--model": "tiny", "--seq": "16"}
    argv = ["step", "--out", str(tmp_path), "--warmup", "0", "--iters", "1"]
    for flag, value in base.items():
        if flag not in args:
            argv += [flag, value]
    code, out, err = cli(*argv, *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "step.jsonl").exists() or read_records(tmp_path) == []


def test_unsupported_precision_and_unwritable_out(cli, tmp_path, monkeypatch):
    import stepscope.measure.device as device
    import stepscope.measure.step.benchmark  # noqa: F401 - imported now, so that its modules bind the real autocast

    def broken_autocast(*args, **kwargs):
        raise RuntimeError("fp16 is not available here")

    monkeypatch.setattr(device, "autocast", broken_autocast)
    code, _, err = cli("step", *TINY, "--precision", "fp16", "--out", tmp_path)
    assert code == 2 and "fp16 autocast is not supported" in err
    monkeypatch.undo()
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = cli("step", *TINY, "--out", blocker / "sub")
    assert code == 2 and "cannot write results" in err and len(err.strip().splitlines()) == 1


def test_a_backend_that_cannot_run_here_is_refused_before_any_work(cli, tmp_path, monkeypatch):
    from stepscope.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "INTERPRETED", False)  # as if TRITON_INTERPRET had not been set
    code, _, err = cli("step", *TINY, "--attention", "sdpa,flash-triton", "--device", "cpu", "--out", tmp_path)
    assert code == 2 and "flash-triton" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "step.jsonl").exists()  # not even the sdpa point ran


def test_oom_becomes_a_row_and_the_sweep_goes_on(cli, tmp_path, monkeypatch):
    import stepscope.measure.step.benchmark as step

    real = step.benchmark_step

    def fake_oom_for_long_sequences(config):
        if config.workload.seq > 16:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")
        return real(config)

    monkeypatch.setattr(step, "benchmark_step", fake_oom_for_long_sequences)
    code, out, err = cli("step", *TINY, "--seq", "8,32,16", "--out", tmp_path)
    assert code == 0, err
    assert [r["status"] for r in read_records(tmp_path)] == ["ok", "oom", "ok"]
    assert "oom" in out


def test_ctrl_c_keeps_finished_points_and_resume_skips_them(tmp_path):
    """A real SIGINT to a real sweep; then --resume finishes it without duplicates."""
    argv = STEPSCOPE + ["step", "--model", "tiny", "--batch", "2", "--warmup", "0", "--iters", "10",
                        "--seq", "16,32,48,64,80,96", "--out", str(tmp_path)]
    path = tmp_path / "step.jsonl"
    code, err = interrupt_sweep(argv, path, after_lines=1, cwd=tmp_path)
    assert code == 130, err
    assert "Traceback" not in err
    kept = read_records(path)
    assert 1 <= len(kept) < 6
    done = subprocess.run(argv + ["--resume"], capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seqs = [r["config"]["seq"] for r in read_records(path)]
    assert sorted(seqs) == [16, 32, 48, 64, 80, 96]  # every point exactly once
    assert "skipped" in done.stdout


def test_ab_times_two_setups_side_by_side_and_records_one_point(cli, tmp_path):
    code, out, err = cli("step", "--model", "tiny", "--batch", "2", "--seq", "16", "--n-layers", "1,2", "--warmup",
                         "1", "--iters", "3", "--ab", "--out", tmp_path)
    assert code == 0, err
    assert "A         n_layers 1" in out and "B         n_layers 2" in out and "interleaved pairs" in out
    (record,) = read_records(tmp_path / "step-ab.jsonl")
    assert record["status"] == "ok" and record["metrics"]["pairs"] == 3
    assert record["config"]["a"]["model_spec"]["n_layers"] == 1 and record["config"]["b"]["model_spec"]["n_layers"] == 2
    m = record["metrics"]
    assert m["ratio_p10"] <= m["ratio_median"] <= m["ratio_p90"] and m["a_step_n"] == m["b_step_n"] == 3


@pytest.mark.parametrize("args, message", [
    (["--seq", "16,32", "--attention", "naive,sdpa"], "--ab compares exactly two setups"),
    (["--seq", "16"], "these options make 1"),
    (["--seq", "16", "--warmup", "0,1"], "give one value of --warmup"),
    (["--seq", "16,32", "--resume"], "--resume does not apply to --ab"),
])
def test_ab_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    code, _, err = cli("step", "--model", "tiny", "--ab", "--out", tmp_path, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "step-ab.jsonl").exists()


def test_ab_verdict_names_the_faster_setup():
    from stepscope.measure.stats import Stats
    from stepscope.measure.step.ab import StepABResult
    from stepscope.measure.step.config import StepConfig
    from stepscope.measure.timer import ABResult
    from stepscope.spec import get_preset

    config = StepConfig(model=get_preset("tiny"))
    slow_a = ABResult(a=Stats.of([2.0, 2.0, 2.2]), b=Stats.of([1.0, 1.0, 1.0]), ratios=[2.0, 2.0, 2.2])
    assert StepABResult(config, config, slow_a, 1, "cpu").verdict().endswith("B is 2.00x faster")
    fast_a = ABResult(a=Stats.of([1.0, 1.0, 1.0]), b=Stats.of([4.0, 4.0, 4.0]), ratios=[0.25, 0.25, 0.25])
    assert StepABResult(config, config, fast_a, 1, "cpu").verdict().endswith("A is 4.00x faster")
