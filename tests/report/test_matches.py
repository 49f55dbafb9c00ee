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


def predict(seq: int, gpus: int = 1, name: str = "tiny", **plan) -> dict:
    config = {"model": name, "batch": 2, "seq": seq, "precision": "fp32", "mode": "fwd-bwd", "gpus": gpus,
              "model_spec": {**SPEC, "name": name}, "system": "CPU",
              "plan": {"micro_batch": 2, "recompute": "none", "flash_attention": True, **plan}}
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


def test_a_step_pairs_only_with_a_plan_that_runs_as_it_did():
    # 2 micro-batches of 1, recomputation, or unfused attention are not how a single-process step of batch 2 ran
    others = [predict(16, micro_batch=1), predict(16, recompute="full"), predict(16, flash_attention=False)]
    assert step_vs_predict([step(16)], others) == []
    naive = step(16)
    naive["config"]["attention"] = "naive"
    assert len(step_vs_predict([naive], [predict(16), predict(16, flash_attention=False)])) == 1
    no_step_time = step(16)
    del no_step_time["metrics"]["step_ms_median"]
    assert "step_measured_ms" not in step_vs_predict([no_step_time], [predict(16)])[0]


def test_comm_points_pair_with_the_fit_of_their_own_sweep():
    group = {"backend": "gloo", "op": "all_to_allv", "world_size": 2, "dtype": "fp32", "mode": "per-op",
             "in_place": False}
    sizes = [1e3, 1e5, 1e7]

    def sweep(times: list[float], skew: float, command: str) -> list[dict]:
        points = [make_record("comm", {"record": "point", **group, "skew": skew, "size_bytes": size},
                              {"time_us_max": t}) for size, t in zip(sizes, times, strict=True)]
        fit = make_record("comm", {"record": "fit", **group, "skew": skew},
                          fit_alpha_beta(sizes, times, bus_factor=0.5).metrics())
        for record in [*points, fit]:
            record["env"]["command"] = command
        return [*points, fit]

    first = sweep([60.0, 150.0, 9000.0], 0.0, "comm --skew 0,2")[:3] + sweep([90.0, 400.0, 20000.0], 2.0,
                                                                           "comm --skew 0,2")[:3]
    fits = [sweep([60.0, 150.0, 9000.0], 0.0, "comm --skew 0,2")[3], sweep([90.0, 400.0, 20000.0], 2.0,
                                                                          "comm --skew 0,2")[3]]
    rerun = sweep([30.0, 100.0, 5000.0], 0.0, "comm --skew 0,2")
    # a point of an earlier run without --fit, before the rerun's points: no fit was made from it
    unfitted = make_record("comm", {"record": "point", **group, "skew": 0.0, "size_bytes": 4e6}, {"time_us_max": 1.0})
    rows, labelled = comm_vs_fit([*first, *fits, unfitted, *rerun])
    assert list(labelled) == ["gloo all_to_allv x2 fp32 per-op out-of-place skew 0.0",
                              "gloo all_to_allv x2 fp32 per-op out-of-place skew 2.0",
                              "gloo all_to_allv x2 fp32 per-op out-of-place skew 0.0 (run 2)"]
    assert len(rows) == 9
    for row in rows:  # each point against its own sweep's fit: the fit passes near its own points
        assert abs(row["error_pct"]) < 60, row
        assert row["time_fit_us"] == pytest.approx(labelled[row["group"]].predict_us(row["size_bytes"]))


def test_the_report_benchmark_study_pairs_every_step_and_comm_point():
    from stepscope.report.benchmark import synthetic_study

    records = synthetic_study(100)
    steps = [r for r in records if r["kind"] == "step"]
    pairs = step_vs_predict(steps, [r for r in records if r["kind"] == "predict"])
    assert len(pairs) == len(steps) > 0
    points = [r for r in records if r["kind"] == "comm" and r["config"]["record"] == "point"]
    assert len(comm_vs_fit([r for r in records if r["kind"] == "comm"])[0]) == len(points) > 0
