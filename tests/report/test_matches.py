"""Measured beside predicted: pairs only where the configuration matches, errors with compare's sign, the comm
fit's time from the α–β model itself."""

from __future__ import annotations

import pytest

from stepscope.distributed.collectives.alpha_beta import fit_alpha_beta
from stepscope.report.matches import comm_vs_fit, step_vs_predict
from stepscope.results.store import make_record

SPEC = {"d_model": 64, "n_layers": 2, "name": "tiny"}


def step(seq: int, mode: str = "fwd-bwd", status: str = "ok") -> dict:
    config = {"model": "tiny", "batch": 2, "seq": seq, "precision": "fp32", "mode": mode, "model_spec": SPEC}
    return make_record("step", config, {"step_ms_median": 10.0, "forward_ms_median": 4.0}, status=status)


def predict(seq: int, gpus: int = 1, name: str = "tiny") -> dict:
    config = {"model": name, "batch": 2, "seq": seq, "precision": "fp32", "mode": "fwd-bwd", "gpus": gpus,
              "model_spec": {**SPEC, "name": name}, "system": "CPU"}
    return make_record("predict", config, {"step_s": 0.012, "forward_ms": 3.0})


def test_a_step_pairs_with_the_one_gpu_prediction_of_its_configuration_only():
    rows = step_vs_predict([step(16), step(32), step(16, "train"), step(16, status="oom")],
                           [predict(16), predict(16, gpus=8), predict(64), predict(32, name="renamed")])
    assert [(r["seq"], r["mode"]) for r in rows] == [(16, "fwd-bwd"), (32, "fwd-bwd")]  # the name does not matter
    row = rows[0]
    assert row["step_predicted_ms"] == pytest.approx(12.0, rel=1e-12)
    assert row["step_error_pct"] == pytest.approx(20.0, rel=1e-12)  # (predicted - measured) / measured
    assert row["forward_error_pct"] == pytest.approx(-25.0, rel=1e-12)
    assert "backward_error_pct" not in row


def test_a_comm_point_is_compared_with_the_fit_of_its_group():
    sizes, times = [1e3, 1e5, 1e7], [60.0, 150.0, 9000.0]
    group = {"backend": "gloo", "op": "all_reduce", "world_size": 2, "dtype": "fp32", "mode": "per-op",
             "in_place": True}
    points = [make_record("comm", {"record": "point", **group, "size_bytes": s}, {"time_us_max": t})
              for s, t in zip(sizes, times, strict=True)]
    other = make_record("comm", {"record": "point", **group, "world_size": 4, "size_bytes": 1e3}, {"time_us_max": 1.0})
    fit = fit_alpha_beta(sizes, times, bus_factor=1.0)
    fit_record = make_record("comm", {"record": "fit", **group}, fit.metrics())
    rows, fits = comm_vs_fit([*points, other, fit_record])
    assert len(rows) == 3 and list(fits) == ["gloo all_reduce x2 fp32 per-op in-place"]
    for row, size, time in zip(rows, sizes, times, strict=True):
        assert row["time_fit_us"] == pytest.approx(fit.predict_us(size), rel=1e-12)
        assert row["error_pct"] == pytest.approx(100 * (fit.predict_us(size) - time) / time, rel=1e-12)
