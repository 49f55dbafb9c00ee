"""`stepscope attention` end to end on tiny sizes: tables, records, the plot, both presets, bad input, Ctrl-C."""

import subprocess

import pytest

from stepscope.results.store import read_records
from tests.conftest import STEPSCOPE, interrupt_sweep, subprocess_env

TINY = ["--impl", "naive,sdpa,flash-torch", "--batch", "2", "--heads", "2", "--dim", "16", "--warmup", "0",
        "--iters", "2", "--device", "cpu", "--startup", "0.1"]


def test_sweep_prints_side_by_side_table_writes_records_and_plot(cli, tmp_path):
    code, out, err = cli("attention", *TINY, "--seq", "48,80", "--causal", "--out", tmp_path)
    assert code == 0, err
    assert "batch 2 heads 2 seq 80 dim 16 fp32 causal" in out
    for column in ("fwd_bwd_ms", "fwd_bwd_TFLOPps", "fwd_bwd_vs_sdpa", "fwd_bwd_vs_naive", "bwd_peak_MiB", "max_err"):
        assert column in out
    records = read_records(tmp_path / "attention.jsonl")
    assert [(r["config"]["seq"], r["config"]["impl"]) for r in records] == [
        (s, i) for s in (48, 80) for i in ("naive", "sdpa", "flash-torch")]
    assert all(r["status"] == "ok" and r["config"]["causal"] is True for r in records)
    assert (tmp_path / "attention-sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("grid, expected", [
    ("naive-sweep", {"causal": False, "passes": ["fwd", "bwd"], "dtypes": {"fp32"}, "batch": 8}),
    ("flash-sweep", {"causal": True, "passes": ["fwd", "bwd", "fwd-bwd"], "dtypes": {"bf16", "fp32"}, "batch": 1}),
    ("gpu-goal", {"causal": True, "passes": ["fwd-bwd"], "dtypes": {"fp32"}, "batch": 8}),
])
def test_presets_run_with_overrides_and_plot(cli, tmp_path, grid, expected):
    code, out, err = cli("attention", "--grid", grid, "--seq", "32,64", "--dim", "16", "--warmup", "0",
                         "--iters", "1", "--startup", "0", "--device", "cpu", "--format", "csv", "--out", tmp_path)
    assert code == 0, err
    assert out.splitlines()[0].startswith("batch,heads,seq,dim,dtype,causal,impl,status")
    records = read_records(tmp_path / "attention.jsonl")
    assert {r["config"]["impl"] for r in records} == {"naive", "sdpa", "flash-torch"}
    assert len(records) == 3 * 2 * len(expected["dtypes"])
    assert {r["config"]["dtype"] for r in records} == expected["dtypes"]
    for record in records:
        config = record["config"]
        assert record["status"] == "ok" and config["grid"] == grid and config["batch"] == expected["batch"]
        assert config["causal"] is expected["causal"] and config["passes"] == expected["passes"]
    assert (tmp_path / f"attention-{grid}.png").exists() and "plot:" in err


@pytest.mark.parametrize("args, message", [
    (["--impl", "magic"], "invalid choice 'magic'"),
    (["--seq", "0"], "invalid value '0' in --seq"),
    (["--dtype", "fp8"], "invalid choice 'fp8'"),
    (["--pass", "up"], "invalid choice 'up'"),
    (["--grid", "nope"], "unknown grid 'nope'"),
    (["--iters", "1,2"], "--iters takes one value"),
    (["--seq", "32,64", "--plot", "x.txt"], "--plot must end in .png"),
    (["--device", "cuda"], "no CUDA GPU"),
    (["--causal", "yes"], "unrecognized arguments"),
    (["--startup", "-1"], "invalid value '-1' in --startup"),
])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, message):
    code, out, err = cli("attention", "--seq", "32", "--out", tmp_path, *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "attention.jsonl").exists() or read_records(tmp_path) == []


def test_flash_triton_without_gpu_or_interpreter_is_a_usage_error(cli, tmp_path, monkeypatch):
    from stepscope.kernels import flash_triton

    monkeypatch.setattr(flash_triton, "INTERPRETED", False)  # as if TRITON_INTERPRET had not been set
    code, _, err = cli("attention", "--impl", "sdpa,flash-triton", "--seq", "32", "--device", "cpu", "--out", tmp_path)
    assert code == 2 and "set TRITON_INTERPRET=1" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_keeps_finished_points_and_resume_completes(tmp_path):
    """A real SIGINT to a real sweep: exit 130, finished points kept; --resume adds only the rest."""
    argv = STEPSCOPE + ["attention", *TINY, "--impl", "sdpa,flash-torch", "--iters", "80", "--no-plot",
                        "--seq", "64,96,128,160,192,224", "--out", str(tmp_path)]

    path = tmp_path / "attention.jsonl"
    code, err = interrupt_sweep(argv, path, after_lines=2, cwd=tmp_path)
    assert code == 130, err
    assert "Traceback" not in err
    kept = read_records(path)
    assert 2 <= len(kept) < 12  # Ctrl-C may even land between the two records of one point
    done = subprocess.run(argv + ["--resume"], capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"skipped {len(kept)} record(s)" in done.stdout
    records = read_records(path)
    assert sorted((r["config"]["seq"], r["config"]["impl"]) for r in records) == sorted(
        (s, i) for s in (64, 96, 128, 160, 192, 224) for i in ("sdpa", "flash-torch"))
