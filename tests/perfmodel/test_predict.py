"""`run_predict` from Python: one `predict` record per plan, the same prediction as `evaluate`, bad input
refused before any record."""

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel import evaluate
from stepscope.perfmodel.predict import PredictConfig, PredictPoint, run_predict
from stepscope.results.store import read_records
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system

CONFIG_KEYS = {"model", "model_spec", "batch", "seq", "precision", "mode", "plan", "system", "gpus", "bucket_MiB",
               "buckets"}


def _points():
    plan = ParallelPlan(dp=4, tp=2, micro_batch=2, stack="pytorch-ddp")
    return tuple(PredictPoint(get_preset(name), Workload(batch=32, seq=512, precision="bf16"), plan)
                 for name in ("gpt2", "small"))


def test_run_predict_writes_one_record_per_model(tmp_path):
    outcome = run_predict(PredictConfig(points=_points(), system="H100-SXM", per_layer=True), tmp_path)
    records = read_records(tmp_path / "predict.jsonl")
    assert outcome.path == tmp_path / "predict.jsonl"
    assert [r["config"]["model"] for r in records] == ["gpt2", "small"] and {r["kind"] for r in records} == {"predict"}
    for record, step in zip(records, outcome.steps, strict=True):
        assert set(record["config"]) == CONFIG_KEYS
        assert record["config"]["system"] == "H100-SXM" and record["config"]["gpus"] == 8
        assert record["config"]["bucket_MiB"] == 25.0 and record["config"]["buckets"] == "size"
        assert {"step_s", "tokens_per_s", "mfu_pct", "hfu_pct", "mem_GiB", "feasible", "dp_comm_s"} <= set(
            record["metrics"])
        expected = evaluate(step.point.model, step.point.workload, step.point.plan, load_system("H100-SXM"))
        assert record["metrics"]["step_s"] == pytest.approx(expected.step_s)
        assert "stepscope_version" in record["env"] and step.per_layer and step.title().startswith(
            f"{step.point.model.name} on 8 x H100-SXM")


def test_run_predict_with_the_bucket_planner_and_without_records():
    sized, planned = (run_predict(PredictConfig(points=_points()[:1], buckets=rule)) for rule in ("size", "torch"))
    assert planned.path is None and planned.steps[0].prediction.step_s > 0
    assert planned.steps[0].prediction.metrics()["dp_comm_s"] != sized.steps[0].prediction.metrics()["dp_comm_s"]


@pytest.mark.parametrize("changes, message", [
    ({"bucket_MiB": 0.0}, "--bucket-MiB must be a finite number of at least 1"),
    ({"bucket_MiB": 1e-9}, "--bucket-MiB must be a finite number of at least 1"),
    ({"buckets": "magic"}, "invalid choice 'magic'"),
    ({"system": "H900"}, "unknown system 'H900'"),
    ({"points": (PredictPoint(get_preset("llama3-8b"), Workload(batch=8, seq=128), ParallelPlan(tp=3)),)},
     "tp=3 does not divide n_heads=32"),
])
def test_run_predict_refuses_bad_input_before_any_record(tmp_path, changes, message):
    config = PredictConfig(**{"points": _points(), **changes})
    with pytest.raises(UsageError, match=message):
        run_predict(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()
