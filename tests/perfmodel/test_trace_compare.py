from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.validate.trace_compare import TraceCompareConfig, run_trace_compare
from stepscope.results.store import read_records
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system
from stepscope.traces.config import TraceConfig
from stepscope.traces.run import run_trace
from tests.traces.kineto import two_step_rank


def test_trace_steps_next_to_the_prediction(tmp_path: Path) -> None:
    for r in (0, 1):
        two_step_rank(rank=r, world_size=2).write(tmp_path / f"rank{r}.json")
    run_trace(TraceConfig(paths=(str(tmp_path),), plot=""), tmp_path / "out")
    spec, workload = get_preset("small", n_layers=2), Workload(batch=8, seq=128, precision="bf16", mode="train")
    plan = ParallelPlan(dp=2, micro_batch=4)
    outcome = run_trace_compare(TraceCompareConfig(model=spec, workload=workload, plan=plan,
                                                   records=(str(tmp_path / "out"),), system="A100-80GB"),
                                tmp_path / "out")
    rows = outcome.rows()
    assert [row["rank"] for row in rows] == [0, 1] and rows[0]["steps"] == 2
    assert rows[0]["step_measured_ms"] == pytest.approx(0.09)  # median of 100 and 80 µs
    assert rows[0]["compute_measured_ms"] == pytest.approx(0.06) and rows[0]["comm_exposed_measured_ms"] == 0.02
    predicted = evaluate(spec, workload, plan, load_system("A100-80GB"))
    assert rows[0]["step_predicted_ms"] == pytest.approx(1e3 * predicted.step_s)
    compares = [r for r in read_records(tmp_path / "out" / "compare.jsonl") if r["config"]["source"] == "trace"]
    assert len(compares) == 2


def test_no_trace_records_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UsageError, match="no trace step records"):
        run_trace_compare(TraceCompareConfig(model=get_preset("small"), workload=Workload(batch=1, seq=128),
                                             plan=ParallelPlan(), records=(str(tmp_path / "empty.jsonl"),)))


def test_records_of_one_job_only(tmp_path: Path) -> None:
    for r in (0, 1):
        two_step_rank(rank=r, world_size=2).write(tmp_path / f"rank{r}.json")
    two_step_rank(rank=0, world_size=2, slow=50).write(tmp_path / "other.json")
    out = tmp_path / "out"
    run_trace(TraceConfig(paths=(str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json")), plot=""), out)
    (tmp_path / "sub").mkdir()  # the same files named another way: the same job
    run_trace(TraceConfig(paths=(str(tmp_path / "sub" / ".." / "rank0.json"), str(tmp_path / "rank1.json")),
                          plot=""), out)
    spec, workload = get_preset("small", n_layers=2), Workload(batch=8, seq=128, precision="bf16", mode="train")

    def compare(plan: ParallelPlan) -> list[dict]:
        return run_trace_compare(TraceCompareConfig(model=spec, workload=workload, plan=plan, records=(str(out),),
                                                    system="A100-80GB")).rows()

    rows = compare(ParallelPlan(dp=2, micro_batch=4))  # the same job analysed twice: its steps once
    assert [row["steps"] for row in rows] == [2, 2]
    with pytest.raises(UsageError, match="a job of 2 ranks but the plan has 1 GPUs"):
        compare(ParallelPlan(dp=1, micro_batch=8))
    run_trace(TraceConfig(paths=(str(tmp_path / "other.json"),), plot=""), out)  # another job, same folder
    with pytest.raises(UsageError, match="2 traced jobs"):
        compare(ParallelPlan(dp=2, micro_batch=4))
