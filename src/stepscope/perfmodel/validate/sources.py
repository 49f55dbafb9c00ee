"""Validation errors by source: how well the model predicts each publication's runs, as is, after one factor per
source (what calibrating on one run of that stack gives: the trends), and left out (each source predicted after
calibrating on every other source: what a new user should expect).

A source is one publication (`PublishedRun.source_key`). The factor is multiplicative on the predicted step time
and is the geometric median ratio, exp(median(log(measured / predicted))), robust to one odd run. Leave one
source out: each source's runs are predicted with the factor fitted to the other sources' runs on the same system
(all other sources' runs where no other source used that system), so no run is ever predicted by a fit that saw
its source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median
from typing import Any, Protocol


class Scored(Protocol):
    """A validated run: its source, system, measured and predicted step times."""

    @property
    def source_key(self) -> str: ...

    @property
    def system(self) -> str: ...

    @property
    def measured_s(self) -> float: ...

    @property
    def predicted_s(self) -> float: ...


def _log_ratio(row: Scored) -> float:
    return math.log(row.measured_s / row.predicted_s)


def factor(rows: Sequence[Scored]) -> float:
    """The multiplicative factor on predicted step times that best fits `rows`: exp(median log ratio)."""
    return math.exp(median(_log_ratio(r) for r in rows))


def _error(row: Scored, scale: float = 1.0) -> float:
    return scale * row.predicted_s / row.measured_s - 1.0


def left_out_errors(rows: Sequence[Scored]) -> list[float]:
    """Each run's error when predicted with the factor fitted to the other sources (same system where possible)."""
    out = []
    for row in rows:
        others = [r for r in rows if r.source_key != row.source_key]
        same_system = [r for r in others if r.system == row.system]
        out.append(_error(row, factor(same_system or others)) if others else _error(row))
    return out


def by_source(rows: Sequence[Scored]) -> list[dict[str, Any]]:
    """One row per source: runs, median signed and absolute error, the fitted factor and the error after it,
    and the left-out error; then an `all` row."""
    left_out = dict(zip(map(id, rows), left_out_errors(rows), strict=True))
    sources = sorted({r.source_key for r in rows}, key=lambda key: -sum(r.source_key == key for r in rows))
    table = []
    for key in sources + ["all"]:
        members = [r for r in rows if key in ("all", r.source_key)]
        scale = factor(members)
        table.append({"source": key, "runs": len(members),
                      "systems": "+".join(dict.fromkeys(r.system for r in members)),
                      "median_error_pct": 100 * median(_error(r) for r in members),
                      "median_abs_error_pct": 100 * median(abs(_error(r)) for r in members),
                      "factor": scale,
                      "median_abs_error_after_factor_pct": 100 * median(abs(_error(r, scale)) for r in members),
                      "left_out_median_abs_error_pct": 100 * median(abs(left_out[id(r)]) for r in members)})
    return table
