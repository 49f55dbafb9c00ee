"""The hand-written SVG charts: values land where the axes say, ticks are round and inside the range, hover titles
stop at MAX_HOVER markers and bars at MAX_BARS."""

from __future__ import annotations

import re

import pytest

from stepscope.report.svg import MAX_BARS, MAX_HOVER, Axis, Series, bar_chart, line_chart


def test_linear_and_log_axes_map_the_range_onto_the_pixels():
    linear = Axis(0.0, 10.0, 100.0, 300.0)
    assert linear(0.0) == 100.0 and linear(10.0) == 300.0 and linear(2.5) == pytest.approx(150.0, rel=1e-12)
    log = Axis(1.0, 1000.0, 0.0, 300.0, log=True)
    assert log(10.0) == pytest.approx(100.0, rel=1e-12) and log(1000.0) == pytest.approx(300.0, rel=1e-12)
    assert log.ticks() == [1.0, 10.0, 100.0, 1000.0]
    assert linear.ticks() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    narrow = Axis(2000.0, 8000.0, 0.0, 1.0, log=True)  # less than a decade: 2 and 5 get labels
    assert narrow.ticks() == [2000.0, 5000.0]
    assert Axis(12000.0, 21000.0, 0.0, 1.0, log=True).ticks() == [12000.0, 14000.0, 16000.0, 18000.0, 20000.0]


def test_line_chart_markers_sit_on_their_values_with_a_hover_title():
    svg = line_chart([Series("a", [(1.0, 10.0), (100.0, 1000.0)]), Series("fit", [(1.0, 9.0), (100.0, 900.0)],
                                                                         dashed=True)],
                     x_label="size", y_label="time", log_x=True, log_y=True)
    dots = re.findall(r'<circle class="dot s0" cx="([\d.]+)" cy="([\d.]+)"', svg)
    assert len(dots) == 2  # the dashed series has no markers
    (x1, y1), (x2, y2) = [(float(x), float(y)) for x, y in dots]
    assert x2 > x1 and y2 < y1  # larger size to the right, larger time higher up
    assert "<title>a: 100, 1000</title>" in svg and 'class="line s1 dash"' in svg


def test_hover_titles_and_bars_are_capped():
    many = line_chart([Series("a", [(float(i), float(i)) for i in range(MAX_HOVER + 1)])], x_label="x", y_label="y")
    assert "<title>" not in many and many.count("<circle") == MAX_HOVER + 1
    bars = bar_chart([str(i) for i in range(MAX_BARS + 5)], [float(i) for i in range(MAX_BARS + 5)], y_label="y")
    assert bars.count("<rect") == MAX_BARS and f"the first {MAX_BARS} of {MAX_BARS + 5} rows" in bars


def test_bars_of_one_group_share_a_colour_named_in_the_legend():
    svg = bar_chart(["fwd a", "fwd b", "bwd a"], [1.0, 2.0, 3.0], y_label="ms", groups=["fwd", "fwd", "bwd"])
    assert re.findall(r'<rect class="bar (s\d)"', svg) == ["s0", "s0", "s1"]
    assert '<i class="s0"></i>fwd' in svg and '<i class="s1"></i>bwd' in svg


def test_values_beyond_the_axes_arithmetic_give_a_line_instead_of_a_crash():
    assert "no plot" in bar_chart(["a", "b"], [1e308, -1e308], y_label="y")
    assert "no plot" in line_chart([Series("s", [(1.0, 1e-320), (2.0, 1e300)])], x_label="x", y_label="y",
                                   log_y=True)
    assert "<svg" in bar_chart(["a", "b"], [1.0, -2.0], y_label="y")


def test_a_comm_sweep_is_one_line_of_time_against_size_whatever_follows_the_size():
    from stepscope.report.plots import plot_table

    rows = [{"backend": "gloo", "op": "all_reduce", "size_bytes": size, "requested_bytes": size, "count": size // 4,
             "time_us_max": 10.0 + size / 1e3} for size in (1024, 8192, 65536, 524288)]
    svg = plot_table("comm", "point", rows, ["backend", "op", "size_bytes", "requested_bytes", "count"],
                     "time_us_max")
    assert svg.count('class="line') == 1 and "count=" not in svg
