"""Put measured step records next to the model's prediction for the same configuration, phase by phase.

A measured single-process step (`stepscope step`) is predicted as the plan dp = tp = pp = cp = 1 with
the whole batch as one micro-batch, flash attention for fused backends (sdpa, flash-*) and the unfused
ops for `naive`. Repeated measurements of one configuration are merged (median of their medians).
Error = (predicted − measured) / measured, per phase and for the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from stepscope.perfmodel.evaluate import Prediction, evaluate
from stepscope.perfmodel.records import StepPoint
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
        for phase, (measured, predicted) in self.phases().items():
            row[f"{phase}_measured_ms"] = 1e3 * measured
            row[f"{phase}_predicted_ms"] = 1e3 * predicted
            row[f"{phase}_error_pct"] = 100 * (predicted - measured) / measured
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
