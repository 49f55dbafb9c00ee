"""Validation by source and by trend (validate/sources.py, validate/trends.py), on hand-made rows."""

import math
from dataclasses import dataclass

import pytest

from stepscope.perfmodel.validate.sources import by_source, factor, left_out_errors
from stepscope.perfmodel.validate.trends import trend_rows, trend_sets
from stepscope.perfmodel.validate.validate import validate


@dataclass
class Row:
    source_key: str
    system: str
    measured_s: float
    predicted_s: float


def test_one_factor_per_source_and_each_source_left_out_by_hand():
    rows = [Row("a", "H100", 1.0, 0.8), Row("a", "H100", 2.0, 1.6), Row("a", "H100", 3.0, 2.0),
            Row("b", "H100", 1.0, 1.1), Row("c", "A100", 1.0, 0.5)]
    # source a: ratios measured/predicted 1.25, 1.25, 1.5: the median log ratio is log 1.25
    assert factor(rows[:3]) == pytest.approx(1.25)
    table = {r["source"]: r for r in by_source(rows)}
    assert table["a"]["median_error_pct"] == pytest.approx(-20.0)
    assert table["a"]["median_abs_error_after_factor_pct"] == pytest.approx(0.0)  # two runs fit exactly
    # b left out: fitted on the other sources' H100 runs (a's: 1.25), 1.1 x 1.25 / 1 - 1 = 37.5 %
    left = dict(zip(map(id, rows), left_out_errors(rows), strict=True))
    assert left[id(rows[3])] == pytest.approx(0.375)
    # c alone on its system: fitted on every other run (ratios 1.25, 1.25, 1.5, 1/1.1): median of the logs of
    # four values, the mean of the middle two: sqrt(1.25 x 1.25)
    assert left[id(rows[4])] == pytest.approx(0.5 * 1.25 - 1.0)
    assert table["all"]["runs"] == 5 and table["a"]["runs"] == 3
    assert math.isclose(table["b"]["factor"], 1 / 1.1)


def test_trends_compare_the_models_ratio_with_the_published_one():
    sets = trend_sets()
    assert len(sets) >= 15 and all(float(s["published_ratio"]) > 0 for s in sets)
    rows = validate(dataset="modern_runs")
    trends = {t["trend"]: t for t in trend_rows(rows)}
    by_label = {r.run.label: r for r in rows}
    name = "fp8/bf16: dgxc GPT-3 175B 512 H100"
    fp8, bf16 = by_label["dgxc-gpt3-175b-fp8-512"], by_label["dgxc-gpt3-175b-bf16-512"]
    # the same batch and GPUs: the tokens/s ratio is the inverse ratio of the step times
    assert trends[name]["predicted_ratio"] == pytest.approx(bf16.prediction.step_s / fp8.prediction.step_s)
    assert trends[name]["measured_ratio"] == pytest.approx(bf16.run.measured_step_s / fp8.run.measured_step_s)
    assert trends[name]["measured_ratio"] == pytest.approx(trends[name]["published_ratio"], abs=5e-4)
    assert trends[name]["error_pct"] == pytest.approx(
        100 * (trends[name]["predicted_ratio"] / trends[name]["measured_ratio"] - 1))
