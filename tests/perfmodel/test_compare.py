"""`run_compare` from Python: one `compare` record per measured configuration; no usable record is refused
before any record file is made."""

import json
from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.validate.compare import CompareConfig, run_compare
from stepscope.results.store import read_records

REAL = Path(__file__).parent / "data" / "step_cpu_2core_small_medium.jsonl"


def test_run_compare_writes_one_record_per_configuration(tmp_path):
    outcome = run_compare(CompareConfig(records=(str(REAL),)), tmp_path)
    records = read_records(tmp_path / "compare.jsonl")
    assert outcome.path == tmp_path / "compare.jsonl" and len(records) == len(outcome.comparisons) == 4
    for record in records:
        assert record["kind"] == "compare" and record["config"]["system"] == "CPU"
        assert {"model", "model_spec", "batch", "seq", "attention", "host", "merged_records"} <= set(record["config"])
        assert {"forward_measured_ms", "forward_predicted_ms", "forward_error_pct", "step_error_pct"} <= set(
            record["metrics"])
    assert {row["phase"] for row in outcome.summary()} == {"forward", "backward", "step"} and outcome.notes() == []


def test_run_compare_with_filters_and_without_matches(tmp_path):
    outcome = run_compare(CompareConfig(records=(str(REAL),), where=("seq=128",)))
    assert outcome.path is None and {row["seq"] for row in outcome.rows()} == {128}
    with pytest.raises(UsageError, match="no usable step records .* matching the filters"):
        run_compare(CompareConfig(records=(str(REAL),), where=("seq=999",)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_known_errors_give_exact_percentages_step_error_and_summary(tmp_path):
    """Measured times set to known multiples of the prediction: error = (predicted - measured) / measured, per
    phase with its sign, the step's from the sums of its phases, the summary's median and max of |error|."""
    predicted = {(r["model"], r["batch"], r["seq"]): r for r in run_compare(CompareConfig(records=(str(REAL),))).rows()}
    forward_times = [2.0, 4.0, 0.5, 1.25]  # measured / predicted: errors -50, -75, +100, -20 %
    backward_times = [0.5, 0.5, 2.0, 1.0]  # +100, +100, -50, 0 %
    expected, lines = {}, []
    for i, line in enumerate(REAL.read_text().splitlines()):
        record = json.loads(line)
        config = record["config"]
        key = (config["model"], config["batch"], config["seq"])
        pf, pb = predicted[key]["forward_predicted_ms"], predicted[key]["backward_predicted_ms"]
        mf, mb = forward_times[i] * pf, backward_times[i] * pb
        record["metrics"]["forward_ms_median"], record["metrics"]["backward_ms_median"] = mf, mb
        expected[key] = (100 * (1 / forward_times[i] - 1), 100 * (1 / backward_times[i] - 1),
                         100 * ((pf + pb) - (mf + mb)) / (mf + mb))
        lines.append(json.dumps(record))
    assert len(expected) == 4
    measured = tmp_path / "step.jsonl"
    measured.write_text("\n".join(lines) + "\n")

    outcome = run_compare(CompareConfig(records=(str(measured),)))
    for row in outcome.rows():
        forward, backward, step = expected[(row["model"], row["batch"], row["seq"])]
        assert row["forward_error_pct"] == pytest.approx(forward, rel=1e-9)
        assert row["backward_error_pct"] == pytest.approx(backward, rel=1e-9, abs=1e-9)
        assert row["step_error_pct"] == pytest.approx(step, rel=1e-9)
        assert row["step_measured_ms"] == pytest.approx(row["forward_measured_ms"] + row["backward_measured_ms"])
    assert sorted(round(e[0]) for e in expected.values()) == [-75, -50, -20, 100]  # the multiples were applied
    summary = {row["phase"]: row for row in outcome.summary()}
    assert summary["forward"]["median_abs_error_pct"] == pytest.approx((50 + 75) / 2, rel=1e-9)  # of 20 50 75 100
    assert summary["forward"]["max_abs_error_pct"] == pytest.approx(100, rel=1e-9)
    assert summary["backward"]["median_abs_error_pct"] == pytest.approx((50 + 100) / 2, rel=1e-9)  # of 0 50 100 100
    assert summary["backward"]["max_abs_error_pct"] == pytest.approx(100, rel=1e-9)
    steps = sorted(abs(e[2]) for e in expected.values())
    assert summary["step"]["median_abs_error_pct"] == pytest.approx((steps[1] + steps[2]) / 2, rel=1e-9)
    assert summary["step"]["max_abs_error_pct"] == pytest.approx(steps[3], rel=1e-9)
    assert all(row["points"] == 4 for row in summary.values())
