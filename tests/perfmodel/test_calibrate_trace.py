"""`calibrate --trace` on real H100 traces of stepscope's own `small` model (tests/data/traces): fitted on batch 8,
it reproduces batch 8 per category within 10 % and predicts batch 16 within 20 %; overhead is the kernel overhead or
the host's time less the GPU's work, whichever is longer, with the kernel overhead measured from the queued gaps."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from stepscope.perfmodel.calibrate.trace_categories import category_rows, model_kernels, predicted_categories
from stepscope.perfmodel.calibrate.trace_run import TraceCalibrationConfig, run_calibrate_trace
from stepscope.results.store import read_records
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system
from stepscope.traces.run import write_trace_records
from tests.traces.kineto import GEMM, TraceBuilder

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
SMALL = get_preset("small")


def _run(batch: int) -> tuple[Workload, ParallelPlan]:
    return Workload(batch=batch, seq=512, precision="bf16", mode="train"), ParallelPlan(micro_batch=batch)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("calibrate")
    workload, plan = _run(8)
    outcome = run_calibrate_trace(TraceCalibrationConfig(traces=(str(TRACES / "small-b8.json.gz"),),
                                                         system_out=str(folder / "fitted.toml"), model=SMALL,
                                                         workload=workload, plan=plan), folder / "b8",
                                  analyse=write_trace_records)
    other = [r for r in read_records(write_trace_records((str(TRACES / "small-b16.json.gz"),), folder / "b16"))]
    return outcome, load_system(str(folder / "fitted.toml")), other


def test_in_sample_every_category_within_10_percent(fitted) -> None:
    outcome, _, _ = fitted
    errors = {c["category"]: c["fitted_error_pct"] for c in outcome.fit.categories if c["measured_ms"] > 0}
    assert set(errors) == {"matmul", "attention", "vector", "optimizer", "overhead"}
    assert all(abs(error) < 10 for error in errors.values()), errors
    assert outcome.system_out.exists() and outcome.path is not None
    assert any("host-bound" in note for note in outcome.fit.notes)


def test_other_batch_every_category_within_20_percent(fitted) -> None:
    _, system, b16 = fitted
    workload, plan = _run(16)
    rows = category_rows(SMALL, workload, plan, system, b16)
    errors = {row["category"]: row["error_pct"] for row in rows if row["measured_ms"] > 0}
    assert set(errors) == {"matmul", "attention", "vector", "optimizer", "overhead"}
    assert all(abs(error) < 20 for error in errors.values()), errors


def test_overhead_is_the_hosts_time_less_the_gpus_work(fitted) -> None:
    _, system, b16 = fitted
    workload, plan = _run(16)
    host = statistics.median(r["metrics"]["host_ms"] for r in b16 if r["config"]["record"] == "step") / 1e3
    alone = predicted_categories(SMALL, workload, plan, system)  # no host: the kernel overhead only
    given = predicted_categories(SMALL, workload, plan, system, host)
    work = sum(seconds for category, seconds in alone.items() if category != "overhead")
    assert given["overhead"] == pytest.approx(host - work) and host - work > alone["overhead"] > 0
    fast_host = predicted_categories(SMALL, workload, plan, system, work / 2)  # a GPU-bound run
    assert fast_host["overhead"] == pytest.approx(alone["overhead"])
    assert {c: given[c] for c in given if c != "overhead"} == pytest.approx(
        {c: alone[c] for c in alone if c != "overhead"})


def test_kernel_overhead_is_the_queued_gap_per_model_kernel(fitted) -> None:
    outcome, system, _ = fitted
    steps = [r for r in read_records(outcome.path.parent / "trace.jsonl") if r["config"]["record"] == "step"]
    gap = statistics.median(r["metrics"]["launch_gap_us"] for r in steps)
    kernels = statistics.median(r["metrics"]["kernels"] for r in steps)
    assert 2.0 < gap < 2.5  # an H100 between back-to-back kernels
    workload, plan = _run(8)
    model = model_kernels(SMALL, workload, plan, system)
    assert system.accelerator.kernel_overhead_us == pytest.approx(gap * kernels / model, rel=1e-6)
    (row,) = [r for r in outcome.fit.rows if r["parameter"] == "kernel_overhead_us"]
    assert row["fitted"] == pytest.approx(system.accelerator.kernel_overhead_us)


def test_a_trace_without_shapes_says_what_was_not_fitted(tmp_path: Path) -> None:
    trace = TraceBuilder().step(1, 0, 100).kernel(GEMM, 2, 50, launch_at=1)
    path = trace.write(tmp_path / "r.json")
    outcome = run_calibrate_trace(TraceCalibrationConfig(traces=(str(path),), base="H100-SXM",
                                                         system_out=str(tmp_path / "s.toml")), None,
                                  analyse=write_trace_records)
    assert any("no roofline records" in note for note in outcome.fit.notes)
    assert any("no --model" in note for note in outcome.fit.notes)


def test_calibrate_then_compare_on_the_command_line(cli, tmp_path: Path) -> None:
    run = ("--model", "small", "--seq", "512", "--precision", "bf16")
    code, out, err = cli("calibrate", "--trace", TRACES / "small-b8.json.gz", *run, "--global-batch", "8",
                         "--micro-batch", "8", "--system-out", tmp_path / "s.toml", "--out", tmp_path / "b8")
    assert code == 0, err
    assert "kernel_overhead_us" in out and "host-bound" in out
    code, out, err = cli("compare", tmp_path / "b8", "--trace", *run, "--global-batch", "8", "--micro-batch", "8",
                         "--system", tmp_path / "s.toml", "--format", "csv")
    assert code == 0, err
    assert "overhead" in out and "host_measured_ms" in out


def test_a_truncated_trace_is_one_line_and_writes_no_system(cli, tmp_path: Path) -> None:
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"ph": "X", ')
    code, _, err = cli("calibrate", "--trace", tmp_path / "cut.json", "--system-out", tmp_path / "s.toml",
                       "--out", tmp_path / "o")
    assert code == 2 and err.count("\n") == 1 and "cut.json" in err
    assert not (tmp_path / "s.toml").exists() and not list((tmp_path / "o").glob("*"))
