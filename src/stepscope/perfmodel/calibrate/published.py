"""Calibrate a training stack from a few end-to-end runs of it, then predict its other runs.

This is how an HPC centre or a team uses the model on its own software: measure a few runs (e.g. on 512 GPUs), fit,
predict 4,096. An end-to-end run gives one number (its step time), so one parameter is fitted: the stack's
`compute_efficiency`, a factor on the system's compute-efficiency curve (GEMM and attention rates; bandwidths,
latencies and overheads stay as the system states them). It minimizes the sum of squared log errors of the fitting
runs (golden-section search: the error is unimodal in the factor), the curve capped at `rates.MAX_CURVE` of the
peak. The runs of the same stack not used for the fit are then predicted with the fitted stack: that is the
out-of-sample error. The runs come from a shipped dataset or from your own CSV in the same schema
(docs/validation-data.md); the fitted stack is written as a TOML file that `--stack` accepts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.model.rates import scale_curve
from stepscope.perfmodel.runs import RunRecords, system_of
from stepscope.perfmodel.validate.datasets import PublishedRun
from stepscope.perfmodel.validate.validate import load_runs
from stepscope.results.files import check_writable_file
from stepscope.spec.stack import StackSpec, load_stack, stack_to_toml

FACTOR_RANGE = (0.2, 3.0)


@dataclass(frozen=True)
class PublishedCalibrationConfig:
    """Which runs to fit, and where the fitted stack goes."""

    dataset: str = "modern_runs"
    """A shipped dataset (`validate.datasets.DATASETS`), `all`, or a CSV file in the validation schema."""
    runs: tuple[str, ...] = ()
    """Run labels to fit (at least one; all of one stack)."""
    stack_out: str = "calibrated-stack.toml"
    """Where the fitted stack TOML is written."""


@dataclass(frozen=True)
class PublishedCalibration:
    """The fitted factor, the stack it gives, and the error of every run of that stack before and after."""

    factor: float
    stack: StackSpec
    base: StackSpec
    rows: list[dict[str, Any]]
    stack_out: Path
    path: Path | None = None

    def summary(self) -> list[dict[str, Any]]:
        """Median and largest |error| in and out of sample, base and fitted."""
        out = []
        for role in ("fit", "held out"):
            rows = [r for r in self.rows if r["role"] == role]
            if rows:
                out.append({"runs": role, "n": len(rows),
                            "base_median_abs_error_pct": median(abs(r["base_error_pct"]) for r in rows),
                            "fitted_median_abs_error_pct": median(abs(r["fitted_error_pct"]) for r in rows),
                            "fitted_max_abs_error_pct": max(abs(r["fitted_error_pct"]) for r in rows)})
        return out


def with_factor(run: PublishedRun, factor: float) -> float:
    """The run's predicted step time with its stack's compute efficiency times `factor` (which scales the system's
    efficiency curve: `model.rates.on_stack`)."""
    return evaluate(run.model, run.workload, run.plan, scale_curve(system_of(run.system), factor)).step_s


def fit_factor(runs: Sequence[Any], predict: Callable[[Any, float], float], tolerance: float = 1e-4) -> float:
    """The factor minimizing the squared log errors of `runs` (golden-section search); `predict(run, factor)` is
    the run's step time with it, `run.measured_step_s` the measured one."""
    def loss(factor: float) -> float:
        return sum(math.log(predict(run, factor) / run.measured_step_s) ** 2 for run in runs)

    lo, hi = FACTOR_RANGE
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tolerance:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2


def run_calibrate_published(config: PublishedCalibrationConfig,
                            out: str | os.PathLike | None = None) -> PublishedCalibration:
    """Fit the stack's compute efficiency to `config.runs`, write the fitted stack TOML, predict every run of that
    stack with the base and the fitted stack, and append one `calibrate-published` record (None: no records)."""
    runs = load_runs(config.dataset)
    by_label = {run.label: run for run in runs}
    unknown = [label for label in config.runs if label not in by_label]
    if not config.runs or unknown:
        raise UsageError(f"--runs must name runs of {config.dataset}: {', '.join(by_label)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    fitting = [by_label[label] for label in config.runs]
    stacks = {run.stack for run in fitting}
    if len(stacks) != 1:
        raise UsageError(f"the runs to fit must share one stack, got {', '.join(sorted(stacks))}")
    base = load_stack(stacks.pop())
    target = check_writable_file(config.stack_out, "the stack")
    records = RunRecords(out, "calibrate-published")

    predict = with_factor
    factor = fit_factor(fitting, predict)
    fitted = dataclasses.replace(base, name=f"{base.name}-fitted",
                                 compute_efficiency=base.compute_efficiency * factor)
    header = (f"stepscope calibrate --published {config.dataset}: {base.name}'s compute efficiency x {factor:.4f}, "
              f"fitted to {', '.join(config.runs)}")
    try:
        target.write_text(stack_to_toml(fitted, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    rows = []
    for run in runs:
        if run.stack != base.name:
            continue
        rows.append({"run": run.label, "role": "fit" if run.label in config.runs else "held out",
                     "system": run.system, "gpus": run.plan.gpus, "precision": run.workload.precision,
                     "measured_step_s": run.measured_step_s,
                     "base_error_pct": 100 * (predict(run, 1.0) / run.measured_step_s - 1),
                     "fitted_error_pct": 100 * (predict(run, factor) / run.measured_step_s - 1)})
    outcome = PublishedCalibration(factor, fitted, base, rows, target, records.path)
    records.append({"dataset": config.dataset, "runs": list(config.runs), "base": base.name,
                    "stack_out": str(target)},
                   {"efficiency_factor": factor, **{f"{s['runs'].replace(' ', '_')}_{k}": v
                                                    for s in outcome.summary() for k, v in s.items() if k != "runs"}})
    return outcome
