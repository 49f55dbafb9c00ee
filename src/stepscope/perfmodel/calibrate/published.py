"""Calibrate a system from a few published end-to-end runs of one stack, then predict the others.

This is how an HPC centre uses the model: measure a few runs (e.g. on 512 GPUs), fit, predict 4,096. An
end-to-end run gives one number (its step time), so one parameter is fitted: a factor on the system's whole
compute-efficiency curve (GEMM and attention rates; bandwidths, latencies and overheads stay as the base
preset states them). It minimizes the sum of squared log errors of the fitting runs (golden-section search,
the error is unimodal in the factor), capped so that no op exceeds `MAX_CURVE` of the peak. The runs not used
for the fit, on the same system, are then predicted with the fitted system: that is the out-of-sample error.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.runs import RunRecords, check_choice, system_of
from stepscope.perfmodel.validate.datasets import DATASETS, PublishedRun, load_dataset
from stepscope.results.files import check_writable_file
from stepscope.spec.system import SystemSpec, system_to_toml

MAX_CURVE = 0.95
"""The fitted curve stays at or below 95 % of the peak (cuBLAS's best large GEMMs on H100/A100)."""
FACTOR_RANGE = (0.2, 3.0)


@dataclass(frozen=True)
class PublishedCalibrationConfig:
    """Which published runs to fit, and where the fitted system goes."""

    dataset: str = "modern_runs"
    """A shipped dataset (`stepscope.perfmodel.validate.datasets.DATASETS`)."""
    runs: tuple[str, ...] = ()
    """Run labels to fit (at least one; all on one system)."""
    system_out: str = "calibrated.toml"
    """Where the fitted system TOML is written."""


@dataclass(frozen=True)
class PublishedCalibration:
    """The fitted factor, the system it gives, and the error of every run of that system before and after."""

    factor: float
    system: SystemSpec
    base: SystemSpec
    rows: list[dict[str, Any]]
    system_out: Path
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


def scaled(system: SystemSpec, factor: float) -> SystemSpec:
    """`system` with every knot of its efficiency curve times `factor`, capped. Fused attention follows: its
    efficiency is `flash_efficiency` times the curve's, so it must not be scaled again."""
    acc = system.accelerator
    curve = tuple((gflop, min(MAX_CURVE, eff * factor)) for gflop, eff in acc.matrix_efficiency_by_GFLOP)
    return dataclasses.replace(system, name=f"{system.name}-fitted",
                               accelerator=dataclasses.replace(acc, matrix_efficiency_by_GFLOP=curve))


def log_error(run: PublishedRun, system: SystemSpec) -> float:
    return math.log(evaluate(run.model, run.workload, run.plan, system).step_s / run.measured_step_s)


def fit_factor(runs: Sequence[PublishedRun], base: SystemSpec, tolerance: float = 1e-4) -> float:
    """The efficiency factor minimizing the squared log errors of `runs` (golden-section search)."""
    def loss(factor: float) -> float:
        system = scaled(base, factor)
        return sum(log_error(run, system) ** 2 for run in runs)

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
    """Fit the efficiency factor to `config.runs`, write the fitted system TOML, predict every run of that system
    with the base and the fitted system, and append one `calibrate-published` record (None: no records)."""
    check_choice(config.dataset, DATASETS)
    runs = load_dataset(config.dataset)
    by_label = {run.label: run for run in runs}
    unknown = [label for label in config.runs if label not in by_label]
    if not config.runs or unknown:
        raise UsageError(f"--runs must name runs of {config.dataset}: {', '.join(by_label)}"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    fitting = [by_label[label] for label in config.runs]
    systems = {run.system for run in fitting}
    if len(systems) != 1:
        raise UsageError(f"the runs to fit must share one system, got {', '.join(sorted(systems))}")
    base = system_of(systems.pop())
    target = check_writable_file(config.system_out, "the system")
    records = RunRecords(out, "calibrate-published")
    factor = fit_factor(fitting, base)
    fitted = scaled(base, factor)
    header = (f"stepscope calibrate --published {config.dataset}: {base.name}'s efficiency curve x {factor:.4f}, "
              f"fitted to {', '.join(config.runs)}")
    try:
        target.write_text(system_to_toml(fitted, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    rows = []
    for run in runs:
        if run.system != base.name:
            continue
        rows.append({"run": run.label, "role": "fit" if run.label in config.runs else "held out",
                     "gpus": run.plan.gpus, "precision": run.workload.precision,
                     "measured_step_s": run.measured_step_s,
                     "base_error_pct": 100 * math.expm1(log_error(run, base)),
                     "fitted_error_pct": 100 * math.expm1(log_error(run, fitted))})
    outcome = PublishedCalibration(factor, fitted, base, rows, target, records.path)
    records.append({"dataset": config.dataset, "runs": list(config.runs), "base": base.name,
                    "system_out": str(target)},
                   {"efficiency_factor": factor, **{f"{s['runs'].replace(' ', '_')}_{k}": v
                                                    for s in outcome.summary() for k, v in s.items() if k != "runs"}})
    return outcome
