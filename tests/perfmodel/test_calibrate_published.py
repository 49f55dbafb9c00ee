"""Calibrating a stack from published end-to-end runs: one compute-efficiency factor fitted to a few runs of one
stack lowers their error, the stack's other runs are predicted with it, the fitted stack is a TOML file `--stack`
reads back, and bad run names are one clear line."""

import math

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.published import PublishedCalibrationConfig, fit_factor, run_calibrate_published
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.model.op_types import Cost
from stepscope.perfmodel.model.rates import op_time, scale_curve
from stepscope.perfmodel.validate.datasets import load_dataset
from stepscope.results.store import read_records
from stepscope.spec.stack import load_stack
from stepscope.spec.system import load_system


class Run:
    """A stand-in run of a known measured time (the fit only reads `measured_step_s`)."""

    def __init__(self, measured: float) -> None:
        self.measured_step_s = measured


def test_the_fitted_factor_minimizes_the_log_error_by_hand():
    # predicted = 2 / factor against measured 1 and 1.21: the squared log errors are least where 2 / factor is their
    # geometric mean, sqrt(1.21) = 1.1
    runs = [Run(1.0), Run(1.21)]
    factor = fit_factor(runs, lambda run, f: 2.0 / f, tolerance=1e-7)
    assert factor == pytest.approx(2.0 / math.sqrt(1.0 * 1.21), rel=1e-5)


def test_run_calibrate_published_writes_the_stack_and_predicts_the_held_out_runs(tmp_path):
    config = PublishedCalibrationConfig(dataset="narayanan2021_table1", runs=("39.1B", "145.6B"),
                                        stack_out=str(tmp_path / "fitted.toml"))
    outcome = run_calibrate_published(config, tmp_path / "out")
    text = (tmp_path / "fitted.toml").read_text()
    assert text.startswith("#") and outcome.base.name == "megatron-lm-2022"
    roles = [row["role"] for row in outcome.rows]
    assert roles.count("fit") == 2 and roles.count("held out") == 8
    fit, _ = outcome.summary()
    assert fit["fitted_median_abs_error_pct"] <= fit["base_median_abs_error_pct"]
    # the written stack is the base with the factor, and a plan on it predicts what the fit predicted
    stack = load_stack(str(tmp_path / "fitted.toml"))
    assert stack.compute_efficiency == pytest.approx(outcome.factor) and stack.data_parallel == "after-backward"
    run = next(r for r in load_dataset("narayanan2021_table1") if r.label == "1.7B")
    row = next(r for r in outcome.rows if r["run"] == "1.7B")
    fitted = evaluate(run.model, run.workload, run.plan.replace(stack=str(tmp_path / "fitted.toml")),
                      load_system("A100-80GB"))
    assert row["fitted_error_pct"] == pytest.approx(100 * (fitted.step_s / run.measured_step_s - 1), rel=1e-6)
    (record,) = read_records(tmp_path / "out")
    assert record["kind"] == "calibrate-published" and record["metrics"]["efficiency_factor"] == outcome.factor


def test_unknown_runs_and_mixed_stacks_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(UsageError, match="unknown: 2T"):
        run_calibrate_published(PublishedCalibrationConfig(dataset="narayanan2021_table1", runs=("2T",),
                                                           stack_out=str(tmp_path / "x.toml")), tmp_path / "out")
    with pytest.raises(UsageError, match="must share one stack"):
        run_calibrate_published(PublishedCalibrationConfig(dataset="all", runs=("1.7B", "dgxc-llama3-8b-bf16-8"),
                                                           stack_out=str(tmp_path / "x.toml")), tmp_path / "out")
    assert not (tmp_path / "x.toml").exists() and not (tmp_path / "out").exists()


def test_one_factor_scales_gemms_and_fused_attention_alike():
    """A fitted factor f divides every matrix op's compute time by f, fused attention's too (not f²: its
    efficiency is flash_efficiency x the curve's, and only the curve is scaled)."""
    base = load_system("H100-SXM")
    fitted = scale_curve(base, 0.9)
    for kind in ("matrix", "attention"):
        cost = Cost(flops=5e11, bytes=0.0, kernels=1)
        before, after = (op_time(cost, kind, s.accelerator, "bf16").compute_s for s in (base, fitted))
        assert after == pytest.approx(before / 0.9, rel=1e-12)
    curve = scale_curve(base, 10.0).accelerator.matrix_efficiency_by_GFLOP  # scaled knot by knot, capped
    assert [eff for _, eff in curve] == [min(0.95, 10 * eff) for _, eff in base.accelerator.matrix_efficiency_by_GFLOP]
