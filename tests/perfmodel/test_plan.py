"""`run_plan` from Python: one `plan` record per top plan, best first; no feasible plan writes none."""

from stepscope.perfmodel.plan import PlanConfig, run_plan
from stepscope.perfmodel.search.search import SearchSpace
from stepscope.results.store import read_records
from stepscope.spec import Workload, get_preset


def test_run_plan_writes_the_top_plans(tmp_path):
    config = PlanConfig(model=get_preset("megatron-1.7b"), workload=Workload(batch=64, seq=2048, precision="bf16"),
                        gpus=16, top=3, space=SearchSpace(zero=(0, 1)))
    outcome = run_plan(config, tmp_path)
    records = read_records(tmp_path / "plan.jsonl")
    assert outcome.path == tmp_path / "plan.jsonl"
    assert [r["config"]["rank"] for r in records] == [1, 2, 3] and {r["kind"] for r in records} == {"plan"}
    assert set(records[0]["config"]) == {"model", "model_spec", "batch", "seq", "precision", "mode", "gpus", "system",
                                         "rank", "plan"}
    assert all(r["config"]["plan"]["zero"] in (0, 1) and r["config"]["system"] == "A100-80GB" for r in records)
    speeds = [r["metrics"]["tokens_per_s"] for r in records]
    assert speeds == sorted(speeds, reverse=True)
    assert records[0]["metrics"]["search_evaluated"] == outcome.result.evaluated > 0
    assert "feasible" not in records[0]["metrics"] and records[0]["metrics"]["search_configs_per_s"] > 0
    assert [row["rank"] for row in outcome.rows()] == [1, 2, 3] and "configs/s" in outcome.summary()


def test_run_plan_without_a_feasible_plan_writes_no_record(tmp_path):
    config = PlanConfig(model=get_preset("megatron-1t"), workload=Workload(batch=8, seq=2048, precision="bf16"),
                        gpus=8)
    outcome = run_plan(config, tmp_path)
    assert outcome.result.top == [] and read_records(tmp_path / "plan.jsonl") == []
    assert "memory excluded all" in outcome.result.why_none()
    assert any(row["rule"] == "memory fits the device" for row in outcome.rejected_rows())
