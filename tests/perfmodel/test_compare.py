"""`run_compare` from Python: one `compare` record per measured configuration; no usable record is refused
before any record file is made."""

from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.compare import CompareConfig, run_compare
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
