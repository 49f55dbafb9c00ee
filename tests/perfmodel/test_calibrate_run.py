"""`run_calibrate` from Python: the fitted system TOML and one `calibrate` record; bad settings are refused
before any file or folder is made."""

import json
from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.run import CalibrateConfig, run_calibrate
from stepscope.perfmodel.records import load_records
from stepscope.results.store import read_records
from stepscope.spec.system import load_system

REAL = Path(__file__).parent / "data" / "step_cpu_2core_small_medium.jsonl"


def test_run_calibrate_writes_the_system_and_one_record(tmp_path):
    target = tmp_path / "systems" / "fitted.toml"
    outcome = run_calibrate(CalibrateConfig(records=(str(REAL),), system_out=str(target), name="fitted"), tmp_path)
    assert outcome.system_out == target and load_system(target).name == "fitted"
    (record,) = read_records(tmp_path / "calibrate.jsonl")
    assert outcome.path == tmp_path / "calibrate.jsonl" and record["kind"] == "calibrate"
    assert record["config"] == {"records": [str(REAL)], "where": [], "base": "CPU",
                                "knots_GFLOP": [0.001, 0.01, 0.1, 1.0, 10.0, 100.0], "prior_weight": 0.01,
                                "max_efficiency": 1.0, "system_out": str(target)}
    assert record["metrics"]["configurations"] == 4 and "kernel_overhead_us" in record["metrics"]["parameter_sources"]
    assert {"forward_median_abs_error_pct", "backward_median_abs_error_pct", "step_median_abs_error_pct"} <= set(
        record["metrics"])
    assert outcome.headline().startswith("fitted fitted to 4 configurations")


@pytest.mark.parametrize("changes, message", [
    ({"max_efficiency": 1.5}, r"--max-efficiency must be in \(0, 1.1\]"),
    ({"prior_weight": -1.0}, "--prior-weight must be a finite number >= 0, got -1"),
    ({"prior_weight": float("inf")}, "--prior-weight must be a finite number >= 0, got inf"),
    ({"knots": (1.0, 0.5)}, "--knots must be positive and strictly increasing, got 1,0.5"),
    ({"where": ("seq",)}, "malformed filter"),
])
def test_run_calibrate_refuses_bad_settings_before_any_file(tmp_path, changes, message):
    new = tmp_path / "new"
    config = CalibrateConfig(records=(str(REAL),), system_out=str(new / "s.toml"), **changes)
    with pytest.raises(UsageError, match=message):
        run_calibrate(config, new)
    assert not new.exists()


def test_run_calibrate_refuses_a_folder_as_the_system_file_before_the_fit(tmp_path):
    with pytest.raises(UsageError, match="cannot write the system to .*: is a directory"):
        run_calibrate(CalibrateConfig(records=(str(REAL),), system_out=str(tmp_path)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _records(tmp_path: Path, change) -> Path:
    """The real records with `change(record)` applied to each; the folder holding them."""
    folder = tmp_path / "records"
    folder.mkdir()
    with open(REAL) as source, open(folder / "step.jsonl", "w") as target:
        for line in source:
            record = json.loads(line)
            change(record)
            target.write(json.dumps(record) + "\n")
    return folder


def test_calibrate_fits_forward_only_records(tmp_path):
    def forward_only(record):
        record["config"]["mode"] = "fwd"
        record["key"] += "-fwd"

    folder = _records(tmp_path, forward_only)
    outcome = run_calibrate(CalibrateConfig(records=(str(folder),), system_out=str(tmp_path / "f.toml")), None)
    phases = {row["phase"]: row for row in outcome.fit_error()}
    assert "backward" not in phases and phases["forward"]["points"] == 4


@pytest.mark.parametrize("change", [
    lambda r: r["config"].update(batch="x"), lambda r: r.pop("metrics"), lambda r: r.update(metrics=None),
    lambda r: r["metrics"].update(forward_ms_median=0), lambda r: r["metrics"].update(backward_ms_median=float("inf")),
    lambda r: r.setdefault("env", {}).update(threads=[2]), lambda r: r.update(env="cpu"), lambda r: r.update(key=[1]),
    lambda r: r["config"].update(batch=2.5),
], ids=["batch-text", "no-metrics", "null-metrics", "zero-time", "infinite-time", "list-threads", "text-env",
        "list-key", "fractional-batch"])
def test_malformed_step_records_are_skipped_and_counted(tmp_path, change):
    first = [True]

    def break_the_first(record):  # only one record breaks: the others still calibrate
        if first[0]:
            change(record)
            first[0] = False

    folder = _records(tmp_path, break_the_first)
    records = load_records([folder])
    # every record read is used or counted as skipped; a line whose sections are not tables is no record at all
    read = read_records(folder)
    assert len(records.steps) + sum(records.skipped.values()) == len(read) and len(records.steps) in (3, 4)
    outcome = run_calibrate(CalibrateConfig(records=(str(tmp_path / "records"),),
                                            system_out=str(tmp_path / "f.toml")), None)
    assert outcome.system_out.exists()
