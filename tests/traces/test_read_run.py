from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.results.store import read_records
from stepscope.traces.config import TraceConfig
from stepscope.traces.read import read_trace
from stepscope.traces.run import run_trace
from tests.traces.kineto import TraceBuilder, two_step_rank


@pytest.mark.parametrize("block", [7, 64, 1 << 24])
def test_plain_gzip_and_block_by_block_reads_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   block: int) -> None:
    # an event name holding braces, brackets, an escaped quote and an escaped backslash before a quote: the block
    # splitter must not cut inside it, whatever the block size
    odd = 'void k<{"a"}>[x] \\"{'
    plain = read_trace(two_step_rank().kernel(odd, 300, 1, launch_at=299).write(tmp_path / "r.json"))
    meta_after = two_step_rank().kernel(odd, 300, 1, launch_at=299)
    text = json.dumps({"traceEvents": meta_after.events, **meta_after.meta})  # distributedInfo after the events
    (tmp_path / "after.json").write_text(text)
    monkeypatch.setattr("stepscope.traces.events.BLOCK_BYTES", block)
    monkeypatch.setattr("stepscope.traces.events.WHOLE_BYTES", 0 if block < 1 << 24 else block)
    for path in (two_step_rank().kernel(odd, 300, 1, launch_at=299).write(tmp_path / "r.json.gz"),
                 tmp_path / "r.json", tmp_path / "after.json"):
        other = read_trace(path)
        assert np.array_equal(other.gpu_ts, plain.gpu_ts) and other.names == plain.names and odd in other.names
        assert other.steps == plain.steps and other.distributed["rank"] == 0
        assert np.array_equal(other.launch_corr, plain.launch_corr)


@pytest.mark.parametrize("block", [64, 1 << 24])
def test_truncated_and_foreign_json_are_one_line_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              block: int) -> None:
    monkeypatch.setattr("stepscope.traces.events.BLOCK_BYTES", block)
    monkeypatch.setattr("stepscope.traces.events.WHOLE_BYTES", 0 if block < 1 << 24 else block)
    text = (two_step_rank().write(tmp_path / "r.json")).read_bytes()
    (tmp_path / "cut.json").write_bytes(text[: len(text) // 2])
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(text)[:300])
    (tmp_path / "other.json").write_text(json.dumps({"hello": [1, 2]}))
    for name, words in (("cut.json", "truncated"), ("cut.json.gz", "truncated"), ("other.json", "not a PyTorch")):
        with pytest.raises(UsageError, match=words) as error:
            read_trace(tmp_path / name)
        assert "\n" not in str(error.value)


def test_a_trace_without_gpu_events_is_refused(tmp_path: Path) -> None:
    path = TraceBuilder().cpu_op("aten::mm", 0, 10).write(tmp_path / "cpu.json")
    with pytest.raises(UsageError, match="no GPU events"):
        read_trace(path)


def test_a_stepscope_cpu_trace_is_analysed_by_its_top_level_ops(tmp_path: Path) -> None:
    trace = TraceBuilder(rank=None).step(1, 0, 100)
    trace.cpu_op("stepscope.forward", 0, 60).cpu_op("aten::linear", 1, 40).cpu_op("aten::mm", 2, 30)
    trace.cpu_op("aten::relu", 45, 10).cpu_op("stepscope.backward", 60, 30)
    outcome = run_trace(TraceConfig(paths=(str(trace.write(tmp_path / "cpu.json")),)), None)
    rank = outcome.ranks[0]
    assert rank.device == "CPU"
    assert rank.total.breakdown.busy_us == 90 and rank.total.breakdown.span_us == 90


def test_run_writes_records_per_rank_step_and_category_and_the_plot(tmp_path: Path) -> None:
    for r in (0, 1):
        two_step_rank(rank=r, world_size=2, slow=5.0 * r).write(tmp_path / f"rank{r}.json")
    assert run_trace(TraceConfig(paths=(str(tmp_path),)), tmp_path / "none").plot is None  # drawn when asked
    assert not (tmp_path / "none" / "trace.png").exists()
    outcome = run_trace(TraceConfig(paths=(str(tmp_path),), plot=str(tmp_path / "out" / "trace.png")), tmp_path / "out")
    records = read_records(tmp_path / "out" / "trace.jsonl")
    kinds = [r["config"]["record"] for r in records]
    assert kinds.count("step") == 4 and kinds.count("rank") == 2 and kinds.count("straggler") == 2
    assert {r["config"]["category"] for r in records if r["config"]["record"] == "category"} == \
        {"matmul", "communication", "elementwise"}
    assert (tmp_path / "out" / "trace.png").stat().st_size > 0
    first = outcome.straggler_rows()[0]
    assert first["slowest_rank"] == 1 and first["spread_ms"] == pytest.approx(0.005)
    assert first["max_wait_ms"] == 0  # the collectives took as long on both ranks


def test_communication_waiting_for_a_slower_rank(tmp_path: Path) -> None:
    fast = two_step_rank(rank=0, world_size=2)
    fast.events = [dict(e, dur=e["dur"] + 8) if e.get("name", "").startswith("nccl") else e for e in fast.events]
    fast.write(tmp_path / "a.json")
    two_step_rank(rank=1, world_size=2).write(tmp_path / "b.json")
    outcome = run_trace(TraceConfig(paths=(str(tmp_path),)), None)
    row = outcome.straggler_rows()[0]
    assert row["waiting_rank"] == 0 and row["max_wait_ms"] == pytest.approx(0.008)


@pytest.mark.parametrize("case", ["world", "duplicate", "truncated", "no-gpu"])
def test_bad_inputs_leave_nothing_written(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    two_step_rank(rank=0, world_size=2).write(folder / "a.json")
    if case == "world":
        two_step_rank(rank=1, world_size=128).write(folder / "b.json")
    elif case == "duplicate":
        two_step_rank(rank=0, world_size=2).write(folder / "b.json")
    elif case == "truncated":
        (folder / "b.json").write_text('{"traceEvents": [{"ph": "X", ')
    else:
        TraceBuilder(rank=1, world_size=2).cpu_op("aten::mm", 0, 1).write(folder / "b.json")
    with pytest.raises(UsageError):
        run_trace(TraceConfig(paths=(str(folder),)), tmp_path / "out")
    assert not (tmp_path / "out" / "trace.jsonl").exists() and not (tmp_path / "out" / "trace.png").exists()


def test_tables_list_the_slowest_ranks_and_the_records_every_rank(tmp_path: Path) -> None:
    for r, slow in enumerate((0.0, 30.0, 10.0)):
        two_step_rank(rank=r, world_size=3, slow=slow).write(tmp_path / f"rank{r}.json")
    outcome = run_trace(TraceConfig(paths=(str(tmp_path),), show_ranks=2, workers=1), tmp_path / "out")
    assert [r.rank for r in outcome.shown] == [1, 2]  # the two slowest, in rank order
    assert {row["rank"] for row in outcome.step_rows()} == {1, 2}
    assert set(outcome.rank_step_ms()[0]) == {"step", "rank1_ms", "rank2_ms"}
    records = read_records(tmp_path / "out" / "trace.jsonl")
    assert {r["config"]["rank"] for r in records if r["config"]["record"] == "step"} == {0, 1, 2}
