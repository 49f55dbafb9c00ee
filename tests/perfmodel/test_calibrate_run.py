"""`run_calibrate` from Python: the fitted system TOML and one `calibrate` record; bad settings are refused
before any file or folder is made."""

from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate_run import CalibrateConfig, run_calibrate
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
    ({"prior_weight": -1.0}, "--prior-weight must be >= 0, got -1"),
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
