"""Plots as small inline SVG written by hand: a line/scatter chart (linear or log axes) and a bar chart.

Why not matplotlib's SVG backend: its files carry fonts as paths and a style block per element (tens of kB per
plot, ~200 B per marker), and the browser cannot restyle them for a dark page. These charts take their colours
from the page's CSS (`currentColor`, classes `s0`..`s7`), so one plot reads in dark and light mode and prints;
each marker or bar carries a `<title>`, the browser's own hover tooltip, while a chart has few enough of them to
stay small (`MAX_HOVER`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from stepscope.results.views import format_value

WIDTH, HEIGHT = 640, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 12, 44
MAX_HOVER = 600
"""Markers with a hover title per chart; above it points are drawn as lines only (size stays bounded)."""
MAX_BARS = 60
"""Bars per bar chart; the rest are left out and the caption says so."""
COLOURS = 8
"""Series colours the stylesheet defines (`.s0` .. `.s7`); more series reuse them."""


@dataclass(frozen=True)
class Series:
    """One line of a chart: named points (x, y)."""

    name: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False
    """Drawn dashed without markers (a model or fit beside measured points)."""
    joined: bool = True
    """Points joined by a line (False: markers only, a scatter)."""
    colour: int | None = None
    """Colour index (None: the series' position), so a fit can share the colour of its points."""

    def css(self, index: int) -> str:
        return f"s{(index if self.colour is None else self.colour) % COLOURS}"


@dataclass(frozen=True)
class Axis:
    """Where a chart's values land: a linear or logarithmic map from [low, high] to pixels [start, end]."""

    low: float
    high: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        low, high, v = self.low, self.high, value
        if self.log:
            low, high, v = math.log10(low), math.log10(high), math.log10(value)
        fraction = 0.5 if high == low else (v - low) / (high - low)
        return self.start + fraction * (self.end - self.start)

    def ticks(self) -> list[float]:
        """Round values inside [low, high]: decades on a log axis, steps of 1, 2 or 5 x 10^k otherwise."""
        if self.log:
            first, last = math.floor(math.log10(self.low)), math.ceil(math.log10(self.high))
            stride = max(1, (last - first) // 6)
            decades = [10.0 ** e for e in range(first, last + 1, stride) if self.low <= 10.0 ** e <= self.high]
            if len(decades) >= 2:
                return decades
            # less than two decades in range: 1, 2 and 5 of each, so the axis still has labels
            marks = [m * 10.0 ** e for e in range(first - 1, last + 1) for m in (1, 2, 5)
                     if self.low <= m * 10.0 ** e <= self.high]
            if len(marks) >= 2:
                return marks
            return Axis(self.low, self.high, self.start, self.end).ticks()  # narrower still: linear steps
        span = self.high - self.low or abs(self.high) or 1.0
        raw = span / 5
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
        first = math.ceil(self.low / step) * step
        return [first + i * step for i in range(int((self.high - first) / step + 1e-9) + 1)]


def _range(values: Sequence[float], log: bool, zero: bool) -> tuple[float, float]:
    values = [v for v in values if v > 0] if log else list(values)
    if not values:
        return (1.0, 10.0) if log else (0.0, 1.0)
    low, high = min(values), max(values)
    if log:  # a margin of a fraction of the span, so points on the edge stay whole
        margin = 1.5 if low == high else (high / low) ** 0.04
        return low / margin, high * margin
    if zero:
        low, high = min(low, 0.0), max(high, 0.0)
    pad = (high - low) * 0.05 or abs(high) * 0.1 or 1.0
    return (low if zero and low == 0 else low - pad, high + pad)


def _frame(x: Axis, y: Axis, x_label: str, y_label: str, x_ticks: bool = True) -> list[str]:
    """Axes, grid lines, tick labels and axis titles."""
    out = [f'<line class="axis" x1="{x.start}" y1="{y.start}" x2="{x.end}" y2="{y.start}"/>',
           f'<line class="axis" x1="{x.start}" y1="{y.start}" x2="{x.start}" y2="{y.end}"/>']
    for tick in y.ticks():
        py = round(y(tick), 1)
        out.append(f'<line class="grid" x1="{x.start}" y1="{py}" x2="{x.end}" y2="{py}"/>'
                   f'<text x="{x.start - 4}" y="{py + 4}" text-anchor="end">{escape(format_value(tick))}</text>')
    if x_ticks:
        for tick in x.ticks():
            px = round(x(tick), 1)
            out.append(f'<line class="grid" x1="{px}" y1="{y.start}" x2="{px}" y2="{y.end}"/>'
                       f'<text x="{px}" y="{y.start + 14}" text-anchor="middle">{escape(format_value(tick))}</text>')
    out.append(f'<text x="{(x.start + x.end) / 2}" y="{HEIGHT - 6}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(12 {(y.start + y.end) / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def _svg(body: list[str], label: str) -> str:
    # no xmlns: an SVG inline in HTML needs none, and the page then names no URL at all
    return (f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'aria-label="{escape(label)}">' + "".join(body) + "</svg>")


def _legend(series: Sequence[Series]) -> str:
    """An HTML legend under the chart (wraps freely, stays readable with many series)."""
    items = [f'<span class="key"><i class="{s.css(i)}{" dash" if s.dashed else ""}"></i>{escape(s.name)}</span>'
             for i, s in enumerate(series)]
    return f'<div class="legend">{"".join(items)}</div>' if len(items) > 1 else ""


def _or_no_plot(chart: Callable[..., str]) -> Callable[..., str]:
    """A chart whose values overflow the arithmetic of its axes (±1e308, subnormal on a log axis) becomes a
    line saying so: one odd record must not cost the reader the whole page."""
    @functools.wraps(chart)
    def drawn(*args: Any, **kwargs: Any) -> str:
        try:
            return chart(*args, **kwargs)
        except (OverflowError, ValueError, ZeroDivisionError):
            return '<p class="caption">no plot: the values are beyond what the axes can draw</p>'
    return drawn


@_or_no_plot
def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, log_x: bool = False,
               log_y: bool = False) -> str:
    """Lines through each series' points (sorted by x), markers with hover values while there are few."""
    points = [(x, y) for s in series for x, y in s.points
              if _finite(x, y) and (x > 0 or not log_x) and (y > 0 or not log_y)]
    x_axis = Axis(*_range([p[0] for p in points], log_x, False), MARGIN_LEFT, WIDTH - MARGIN_RIGHT, log_x)
    y_axis = Axis(*_range([p[1] for p in points], log_y, not log_y), HEIGHT - MARGIN_BOTTOM, MARGIN_TOP, log_y)
    body = _frame(x_axis, y_axis, x_label, y_label)
    hover = sum(len(s.points) for s in series if not s.dashed) <= MAX_HOVER
    for index, s in enumerate(series):
        kept = sorted((x, y) for x, y in s.points if _finite(x, y) and (x > 0 or not log_x) and (y > 0 or not log_y))
        if not kept:
            continue
        colour = s.css(index)
        coords = " ".join(f"{x_axis(x):.1f},{y_axis(y):.1f}" for x, y in kept)
        if s.joined or s.dashed:
            body.append(f'<polyline class="line {colour}{" dash" if s.dashed else ""}" points="{coords}"/>')
        if s.dashed:
            continue
        for x, y in kept:
            title = f"<title>{escape(s.name)}: {escape(format_value(x))}, {escape(format_value(y))}</title>" \
                if hover else ""
            body.append(f'<circle class="dot {colour}" cx="{x_axis(x):.1f}" cy="{y_axis(y):.1f}" r="3">{title}'
                        "</circle>")
    return _svg(body, y_label) + _legend(series)


@_or_no_plot
def bar_chart(labels: Sequence[str], values: Sequence[float], *, y_label: str, x_label: str = "",
              groups: Sequence[str] | None = None) -> str:
    """One bar per label (the first MAX_BARS), each with its value on hover; bars of one of `groups` (a phase, a
    rank) share a colour and the legend names the groups."""
    groups = list(groups) if groups is not None else [""] * len(labels)
    colours = {group: i for i, group in enumerate(dict.fromkeys(groups))}
    kept = [(label, value, group) for label, value, group in zip(labels, values, groups, strict=True)
            if _finite(value)][:MAX_BARS]
    shown = [(label, value) for label, value, _ in kept]
    y_axis = Axis(*_range([v for _, v in shown] or [0.0], False, True), HEIGHT - MARGIN_BOTTOM, MARGIN_TOP)
    x_axis = Axis(0, max(len(shown), 1), MARGIN_LEFT, WIDTH - MARGIN_RIGHT)
    body = _frame(x_axis, y_axis, x_label, y_label, x_ticks=False)
    slot = (x_axis.end - x_axis.start) / max(len(shown), 1)
    base = y_axis(0.0)
    for index, (label, value) in enumerate(shown):
        top = y_axis(value)
        width = min(slot * 0.7, 80.0)  # a lone bar stays a bar, not a wall
        left = x_axis.start + index * slot + (slot - width) / 2
        colour = colours[kept[index][2]] if len(colours) > 1 else (index if len(shown) <= COLOURS else 0)
        body.append(f'<rect class="bar s{colour % COLOURS}" x="{left:.1f}" '
                    f'y="{min(top, base):.1f}" width="{width:.1f}" height="{abs(base - top):.1f}">'
                    f"<title>{escape(label)}: {escape(format_value(value))}</title></rect>")
        if len(shown) <= 12:  # room for a label under every bar
            body.append(f'<text x="{left + width / 2:.1f}" y="{base + 14:.1f}" text-anchor="middle">'
                        f"{escape(_short(label, int(slot / 6.5)))}</text>")
    note = "" if len(shown) == len(labels) else \
        f'<p class="caption">the first {len(shown)} of {len(labels)} rows (every row is in the table)</p>'
    legend = _legend([Series(group, ()) for group in colours]) if len(colours) > 1 else ""
    return _svg(body, y_label) + legend + note


def _short(text: str, room: int) -> str:
    room = max(room, 4)
    return text if len(text) <= room else text[: room - 1] + "…"


def _finite(*values: float) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
