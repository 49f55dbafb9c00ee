"""Trend checks: whether the model moves as measured runs move, not only whether each run is right.

A trend set (`stepscope/data/validation/trend_sets.csv`) names two shipped runs and the published ratio between
them of a per-GPU rate: the same global batch spread over more GPUs, weak scaling, fp8 against bf16, context
parallelism from 32K to 1M tokens. The model's ratio is the same quantity from its two predicted step times; its
error is (predicted ratio / published ratio) − 1. Rates per GPU: tokens/s (batch x seq / step / GPUs); where a
source printed MFU or TFLOP/s, the same times the runs' FLOPs per token, so both ratios count FLOPs alike.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from importlib import resources
from typing import Any


def trend_sets() -> list[dict[str, str]]:
    """The shipped trend sets."""
    text = (resources.files("stepscope") / "data" / "validation" / "trend_sets.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO("\n".join(line for line in text.splitlines() if not line.startswith("#")))))


def _rate(row: Any, quantity: str, predicted: bool) -> float:
    """Per-GPU rate of a validated run (`validate.ValidationRow`): tokens/s, or FLOP/s where the source printed a
    FLOP rate."""
    run = row.run
    step = row.prediction.step_s if predicted else run.measured_step_s
    tokens = run.workload.batch * run.workload.seq / step / run.plan.gpus
    if quantity.startswith(("mfu", "tflops_per_gpu")):  # the published-runs column names (data/validation)
        return tokens * run.published_flops / (run.workload.batch * run.workload.seq)
    return tokens


def trend_rows(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per trend set whose two runs were validated: published, measured and predicted ratios."""
    by_label = {row.run.label: row for row in rows}
    out = []
    for trend in trend_sets():
        top, bottom = by_label.get(trend["numerator_id"]), by_label.get(trend["denominator_id"])
        if top is None or bottom is None:
            continue
        quantity = trend["quantity"]
        measured = _rate(top, quantity, False) / _rate(bottom, quantity, False)
        predicted = _rate(top, quantity, True) / _rate(bottom, quantity, True)
        out.append({"trend": trend["trend_set"], "published_ratio": float(trend["published_ratio"]),
                    "measured_ratio": measured, "predicted_ratio": predicted,
                    "error_pct": 100 * (predicted / measured - 1)})
    return out
