"""Calibrating from published end-to-end runs: one efficiency factor fitted to a few runs of one system lowers
their error, the other runs of that system are predicted with it, bad run names are one clear line."""

import math

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.published import (
    PublishedCalibrationConfig,
    fit_factor,
    log_error,
    run_calibrate_published,
    scaled,
)
from stepscope.perfmodel.model.ops import Cost
from stepscope.perfmodel.model.rates import op_time
from stepscope.perfmodel.validate.datasets import load_dataset
from stepscope.results.store import read_records
from stepscope.spec.system import load_system


def test_the_fitted_factor_minimizes_the_log_error_of_the_fitting_runs():
    runs = {r.label: r for r in load_dataset("narayanan2021_table1")}
    fitting = [runs["39.1B"], runs["145.6B"]]
    base = load_system("A100-80GB")
    factor = fit_factor(fitting, base)
    loss = [sum(log_error(r, scaled(base, f)) ** 2 for r in fitting) for f in (factor * 0.97, factor, factor * 1.03)]
    assert loss[1] <= min(loss[0], loss[2])  # a minimum, not a boundary of the search
    assert loss[1] < sum(log_error(r, base) ** 2 for r in fitting)
    # the curve is scaled knot by knot and capped
    curve = scaled(base, 10.0).accelerator.matrix_efficiency_by_GFLOP
    assert [eff for _, eff in curve] == [min(0.95, 10 * eff) for _, eff in base.accelerator.matrix_efficiency_by_GFLOP]
    assert max(eff for _, eff in curve) == 0.95


def test_run_calibrate_published_writes_the_system_and_predicts_the_held_out_runs(tmp_path):
    config = PublishedCalibrationConfig(dataset="narayanan2021_table1", runs=("39.1B", "145.6B"),
                                        system_out=str(tmp_path / "fitted.toml"))
    outcome = run_calibrate_published(config, tmp_path / "out")
    assert (tmp_path / "fitted.toml").read_text().startswith("#")
    roles = [row["role"] for row in outcome.rows]
    assert roles.count("fit") == 2 and roles.count("held out") == 8
    fit, held = outcome.summary()
    assert fit["fitted_median_abs_error_pct"] <= fit["base_median_abs_error_pct"]
    # the base errors are the validate errors of those runs
    row = next(r for r in outcome.rows if r["run"] == "1.7B")
    run = next(r for r in load_dataset("narayanan2021_table1") if r.label == "1.7B")
    assert row["base_error_pct"] == pytest.approx(100 * math.expm1(log_error(run, load_system("A100-80GB"))))
    (record,) = read_records(tmp_path / "out")
    assert record["kind"] == "calibrate-published" and record["metrics"]["efficiency_factor"] == outcome.factor


def test_unknown_runs_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="unknown: 2T"):
        run_calibrate_published(PublishedCalibrationConfig(dataset="narayanan2021_table1", runs=("2T",),
                                                           system_out=str(tmp_path / "x.toml")), tmp_path / "out")
    assert not (tmp_path / "x.toml").exists() and not (tmp_path / "out").exists()


def test_eight_gpus_of_a_stack_predict_its_other_h100_runs(tmp_path):
    """The HPC-centre workflow on the modern set: fit H100-SXM to the smallest run (NVIDIA's 8-GPU Llama 3.1 8B)
    and predict the other H100 runs (64 to 16,384 GPUs, bf16 and fp8) out of sample. A regression check of the
    figure the README reports, not a tuned result: the factor comes from the one fitting run only."""
    config = PublishedCalibrationConfig(dataset="modern_runs", runs=("dgxc-llama3-8b-bf16-8",),
                                        system_out=str(tmp_path / "fitted.toml"))
    outcome = run_calibrate_published(config, None)
    fit, held = outcome.summary()
    assert held["n"] >= 10
    assert held["fitted_median_abs_error_pct"] < held["base_median_abs_error_pct"]
    assert held["fitted_median_abs_error_pct"] <= 10.0


def test_one_factor_scales_gemms_and_fused_attention_alike():
    """A fitted factor f divides every matrix op's compute time by f, fused attention's too (not f²: its
    efficiency is flash_efficiency x the curve's, and only the curve is scaled)."""
    base = load_system("H100-SXM")
    fitted = scaled(base, 0.9)
    for kind in ("matrix", "attention"):
        cost = Cost(flops=5e11, bytes=0.0, kernels=1)
        before, after = (op_time(cost, kind, s.accelerator, "bf16").compute_s for s in (base, fitted))
        assert after == pytest.approx(before / 0.9, rel=1e-12)
