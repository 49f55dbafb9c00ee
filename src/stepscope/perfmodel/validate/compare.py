"""Put measured step records next to the model's prediction for the same configuration, phase by phase.

A measured single-process step (`stepscope step`) is predicted as the plan dp = tp = pp = cp = 1 with
the whole batch as one micro-batch, flash attention for fused backends (sdpa, flash-*) and the unfused
ops for `naive`. Repeated measurements of one configuration are merged (median of their medians).
Error = (predicted − measured) / measured, per phase and for the step. `run_compare` reads measured records,
predicts them and appends one `compare` record per configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import Prediction, evaluate
from stepscope.perfmodel.records import RecordSet, StepPoint, load_records, parse_where
from stepscope.perfmodel.runs import RunRecords, SystemLike, system_of
from stepscope.results.store import DEFAULT_OUT
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import SystemSpec


def single_process_plan(point: StepPoint) -> ParallelPlan:
    """The plan a measured single-process step ran with."""
    return ParallelPlan(micro_batch=point.workload.batch, flash_attention=point.fused_attention)


def predict_point(point: StepPoint, system: SystemSpec) -> Prediction:
    return evaluate(point.model, point.workload, single_process_plan(point), system)


@dataclass(frozen=True)
class Comparison:
    """One configuration: measured and predicted seconds per phase."""

    point: StepPoint
    prediction: Prediction

    def phases(self) -> dict[str, tuple[float, float]]:
        """phase -> (measured s, predicted s), plus `step` (their sums)."""
        out = {phase: (measured, self.prediction.phases[phase]) for phase, measured in self.point.phases.items()}
        out["step"] = (sum(m for m, _ in out.values()), sum(p for _, p in out.values()))
        return out

    def errors(self) -> dict[str, float]:
        return {phase: (p - m) / m for phase, (m, p) in self.phases().items()}

    def row(self) -> dict[str, Any]:
        spec, w = self.point.model, self.point.workload
        row: dict[str, Any] = {"model": spec.name, "n_layers": spec.n_layers, "d_model": spec.d_model,
                               "batch": w.batch, "seq": w.seq, "mode": w.mode, "precision": w.precision,
                               "attention": self.point.attention}
        errors = self.errors()  # the one formula, shared with summary()
        for phase, (measured, predicted) in self.phases().items():
            row[f"{phase}_measured_ms"] = 1e3 * measured
            row[f"{phase}_predicted_ms"] = 1e3 * predicted
            row[f"{phase}_error_pct"] = 100 * errors[phase]
        return row

    def record(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(config, metrics) for a `compare` record."""
        config = {"model": self.point.model.name, **self.point.workload.to_dict(), "attention": self.point.attention,
                  "system": self.prediction.system, "host": self.point.host, "threads": self.point.threads,
                  "merged_records": self.point.records, "model_spec": self.point.model.to_dict()}
        metrics = {k: v for k, v in self.row().items() if k.endswith(("_ms", "_pct"))}
        return config, metrics


def compare(points: list[StepPoint], system: SystemSpec) -> list[Comparison]:
    """Predict every measured point on `system`."""
    return [Comparison(point, predict_point(point, system)) for point in points]


def summary(comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """Per phase: how many points, median and largest absolute error."""
    phases: dict[str, list[float]] = {}
    for comparison in comparisons:
        for phase, error in comparison.errors().items():
            phases.setdefault(phase, []).append(abs(error))
    return [{"phase": phase, "points": len(errors), "median_abs_error_pct": 100 * median(errors),
             "max_abs_error_pct": 100 * max(errors)} for phase, errors in phases.items()]


@dataclass(frozen=True)
class CompareConfig:
    """Which measured records to predict, and on which system."""

    records: tuple[str, ...] = (DEFAULT_OUT,)
    """Record files or folders."""
    where: tuple[str, ...] = ()
    """Filters `FIELD=VALUE[,VALUE]`: only records whose config FIELD (dotted) has one of the values."""
    system: SystemLike = "CPU"
    """System preset, TOML file or SystemSpec (default: the host the measurements usually come from)."""


@dataclass(frozen=True)
class CompareOutcome:
    """Every measured configuration next to its prediction."""

    system: SystemSpec
    measured: RecordSet
    comparisons: list[Comparison] = field(default_factory=list)
    path: Path | None = None
    """The records file (None: no records were written)."""

    def rows(self) -> list[dict[str, Any]]:
        return [c.row() for c in self.comparisons]

    def summary(self) -> list[dict[str, Any]]:
        return summary(self.comparisons)

    def notes(self) -> list[str]:
        """What was read but not compared."""
        if not (self.measured.attention or self.measured.comm):
            return []
        return [f"note: {len(self.measured.attention)} attention and {len(self.measured.comm)} comm records are used "
                "by calibrate only"]


def run_compare(config: CompareConfig = CompareConfig(), out: str | os.PathLike | None = None) -> CompareOutcome:
    """Predict every measured step configuration of `config.records` and append one `compare` record each to
    `<out>/compare.jsonl` (None: no records). No usable step record is a UsageError, before any output."""
    system = system_of(config.system)
    measured = load_records(config.records, parse_where(config.where))
    if not measured.steps:
        raise UsageError(f"no usable step records in {', '.join(map(str, config.records))}"
                         + (" matching the filters" if config.where else ""))
    for point in measured.steps:
        system.accelerator.matrix_peak(point.workload.precision)  # the precision must exist on the system
    records = RunRecords(out, "compare")
    comparisons = compare(measured.steps, system)
    for comparison in comparisons:
        records.append(*comparison.record())
    return CompareOutcome(system, measured, comparisons, records.path)
