"""The plot of one table of records: the hinted metric (`kinds.HINTS`) or the first median, as a line chart
over a numeric configuration field (one line per combination of the other fields that vary) or as one bar per
row."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stepscope.report.kinds import hint
from stepscope.report.svg import Series, bar_chart, line_chart
from stepscope.results.views import QUIET_SUFFIXES, format_value

MAX_SERIES = 12
"""Lines per line chart; beyond this a chart is unreadable and one bar per row is drawn instead."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def choose_metric(kind: str, table: str | None, rows: Sequence[dict[str, Any]], metric_columns: Sequence[str]) -> \
        str | None:
    """The metric a table is plotted by: the hint's first metric the rows have, else the first median, else the
    first numeric metric (None: nothing numeric to plot)."""
    numeric = [c for c in metric_columns if any(_number(row.get(c)) for row in rows)]
    known = hint(kind, table)
    for name in known.y if known else ():
        if name in numeric:
            return name
    medians = [c for c in numeric if c.endswith("_median")]
    plain = [c for c in numeric if not c.endswith(QUIET_SUFFIXES)]
    return (medians or plain or numeric or [None])[0]


def _follows(rows: Sequence[dict[str, Any]], x: str, column: str) -> bool:
    """Each value of `x` comes with one value of `column`, and `column` takes more than one: it adds nothing to
    x (sizes and the element counts they hold)."""
    seen: dict[Any, Any] = {}
    for row in rows:
        if seen.setdefault(row.get(x), row.get(column)) != row.get(column):
            return False
    return len(set(map(str, seen.values()))) > 1 and len(seen) > 1


def plot_table(kind: str, table: str | None, rows: Sequence[dict[str, Any]], identity: Sequence[str],
               metric: str | None) -> str:
    """Inline SVG (and legend) for one table's rows, or "" when there is nothing to plot."""
    if metric is None:
        return ""
    rows = [row for row in rows if _number(row.get(metric))]
    if not rows:
        return ""
    known = hint(kind, table)
    x = known.x if known else None
    if x is None:  # a numeric field swept over three values or more reads best as a line
        x = next((c for c in identity if all(_number(row.get(c)) for row in rows)
                  and len({row.get(c) for row in rows}) >= 3), None)
    if x is not None and all(_number(row.get(x)) for row in rows):
        # a field that follows x (a comm point's requested bytes and element count follow its size) names no line
        others = [c for c in (known.series if known and known.series else identity)
                  if c != x and not _follows(rows, x, c) and len({str(row.get(c)) for row in rows}) > 1]
        groups: dict[str, list[tuple[float, float]]] = {}
        for row in rows:
            name = " ".join(f"{c}={format_value(row.get(c))}" for c in others) or metric
            groups.setdefault(name, []).append((float(row[x]), float(row[metric])))
        if len(groups) <= MAX_SERIES:
            return line_chart([Series(name, points) for name, points in groups.items()], x_label=x, y_label=metric,
                              log_x=bool(known and known.log), log_y=bool(known and known.log))
    label_fields = [c for c in (known.label if known and known.label else identity) if any(c in r for r in rows)]
    labels = [" ".join(format_value(row.get(c)) for c in label_fields) or str(i + 1) for i, row in enumerate(rows)]
    # with several label fields, the first one (a phase, a rank) colours the bars
    groups = [f"{label_fields[0]}={format_value(row.get(label_fields[0]))}" for row in rows] \
        if len(label_fields) > 1 else None
    return bar_chart(labels, [float(row[metric]) for row in rows], y_label=metric, x_label=" ".join(label_fields),
                     groups=groups)
