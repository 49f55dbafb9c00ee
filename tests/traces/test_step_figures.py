"""Per-step figures of `trace` on synthetic traces built to give known values: each step's span, idle time,
communication, overlap and exposed communication (steps that differ from each other, so that a figure taken over
the whole trace, or over the wrong step, shows), a last step cut by the profiler, the rank totals' step time, and
across ranks the slowest rank (the one waited for) against the rank that waited. Every value by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.traces.analyze import analyze
from stepscope.traces.ranks import across_ranks
from stepscope.traces.read import read_trace
from stepscope.traces.records import step_rows
from tests.traces.kineto import COMPUTE, GEMM, NCCL, TraceBuilder


def three_steps() -> TraceBuilder:
    """Three steps, each unlike the others (µs):

    step 1 (CPU 0-100):   GEMM 0-40, all-reduce 40-70, elementwise 60-80 on another stream; next step's first
                          kernel at 100: span 100, busy 80, idle 20, compute 60, comm 30 of which 10 under compute.
    step 2 (CPU 100-250): GEMM 100-130, all-reduce 130-190, elementwise 140-200 on another stream; next step at
                          250: span 150, busy 100, idle 50, compute 90, comm 60 of which 50 under compute.
    step 3 (CPU 250-300, cut: the profiler stopped inside it): GEMM 250-270, all-reduce 270-290, nothing after:
                          span 40 (to its last kernel's end), busy 40, idle 0, comm 20, none under compute.
    """
    trace = TraceBuilder(rank=0, world_size=1)
    trace.step(1, 0, 100).step(2, 100, 250).step(3, 250, 300)
    trace.kernel(GEMM, 0, 40, launch_at=1).kernel(NCCL, 40, 30, launch_at=2)
    trace.kernel(COMPUTE, 60, 20, launch_at=3, stream=9)
    trace.kernel(GEMM, 100, 30, launch_at=101).kernel(NCCL, 130, 60, launch_at=102)
    trace.kernel(COMPUTE, 140, 60, launch_at=103, stream=9)
    trace.kernel(GEMM, 250, 20, launch_at=251).kernel(NCCL, 270, 20, launch_at=252)
    return trace


EXPECTED = {  # step -> span, busy, idle, compute, comm, comm under compute, exposed comm, overlap %
    1: (100, 80, 20, 60, 30, 10, 20, 100 * 10 / 30),
    2: (150, 100, 50, 90, 60, 50, 10, 100 * 50 / 60),
    3: (40, 40, 0, 20, 20, 0, 20, 0.0),
}


def test_each_step_has_its_own_span_idle_overlap_and_exposed_communication(tmp_path: Path) -> None:
    rank = analyze(read_trace(three_steps().write(tmp_path / "r.json")))
    assert [w.step for w in rank.steps] == [1, 2, 3]
    for window in rank.steps:
        b = window.breakdown
        got = (b.span_us, b.busy_us, b.idle_us, b.compute_us, b.comm_us, b.comm_overlapped_us, b.comm_exposed_us,
               b.overlap_pct)
        assert got == pytest.approx(EXPECTED[window.step], rel=1e-12), f"step {window.step}"
        assert window.collectives == {"all_reduce": [1, EXPECTED[window.step][4]]}


def test_the_totals_leave_out_the_cut_step_and_report_the_mean_counted_step(tmp_path: Path) -> None:
    """The totals count steps 1 and 2 (events 0-200): HTA's span 200, busy 180, comm 90 of which 60 hidden. Their
    `step_ms` is a step: the mean of the counted windows, (100 + 150) / 2 = 125 µs, never below a counted step
    as the span of the counted events alone can be (it ends at the last kernel, before the next step's start)."""
    rank = analyze(read_trace(three_steps().write(tmp_path / "r.json")))
    total = rank.total.breakdown
    assert (total.span_us, total.busy_us, total.idle_us) == (200, 180, 20)
    assert (total.comm_us, total.comm_overlapped_us, total.comm_exposed_us) == (90, 60, 30)
    assert total.overlap_pct == pytest.approx(100 * 60 / 90)
    rows = {row["step"]: row for row in step_rows([rank], 0.5)}
    assert rows["all"]["step_ms"] == pytest.approx(0.125, rel=1e-12)
    assert rows["all"]["gpu_span_ms"] == pytest.approx(0.200, rel=1e-12)
    assert [rows[s]["step_ms"] for s in (1, 2, 3)] == pytest.approx([0.100, 0.150, 0.040])
    assert rows[3]["comm_exposed_ms"] == pytest.approx(0.020) and rows[3]["idle_pct"] == 0


def test_one_counted_step_is_the_totals_step_time(tmp_path: Path) -> None:
    """The shared 128-rank trace's shape: two steps, so one counted, whose kernels end before the next step's first
    kernel. Step 1's window is 100 µs, the counted events span 80: the `all` row says 100."""
    trace = TraceBuilder(rank=0, world_size=1).step(1, 0, 100).step(2, 100, 200)
    trace.kernel(GEMM, 0, 80, launch_at=1).kernel(GEMM, 100, 30, launch_at=101)
    rank = analyze(read_trace(trace.write(tmp_path / "r.json")))
    rows = {row["step"]: row for row in step_rows([rank], 0.5)}
    assert rows[1]["step_ms"] == rows["all"]["step_ms"] == pytest.approx(0.100)
    assert rows["all"]["gpu_span_ms"] == pytest.approx(0.080)


def straggler_pair(tmp_path: Path) -> list:
    """Rank 0 computes 80 µs then all-reduces for 10; rank 1 computes 20 and spends 70 in the all-reduce, waiting
    60 for rank 0. Rank 1's next step starts 1 µs later (its window is 101 µs, rank 0's 100): the longest window
    belongs to the rank that waited, not to the one it waited for."""
    ranks = []
    for rank, (gemm, nccl, next_start) in enumerate(((80, 10, 100), (20, 70, 101))):
        trace = TraceBuilder(rank, 2).step(1, 0, 100).step(2, 100, 200)
        trace.kernel(GEMM, 0, gemm, launch_at=1).kernel(NCCL, gemm, nccl, launch_at=2)
        trace.kernel(GEMM, next_start, 10, launch_at=101)
        ranks.append(analyze(read_trace(trace.write(tmp_path / f"r{rank}.json"))))
    return ranks


def test_the_slowest_rank_is_the_one_waited_for_and_never_the_waiting_one(tmp_path: Path) -> None:
    step = across_ranks(straggler_pair(tmp_path))[0]
    assert step.step_ms == pytest.approx({0: 0.100, 1: 0.101})
    assert step.wait_ms == pytest.approx({0: 0.0, 1: 0.060})
    row = step.row()
    assert row["slowest_rank"] == 0 and row["waiting_rank"] == 1
    assert row["max_wait_ms"] == pytest.approx(0.060)


def test_no_rank_waiting_names_no_waiting_rank(tmp_path: Path) -> None:
    ranks = []
    for rank, next_start in ((0, 100), (1, 103)):
        trace = TraceBuilder(rank, 2).step(1, 0, 100).step(2, 100, 200)
        trace.kernel(GEMM, 0, 50, launch_at=1).kernel(NCCL, 50, 10, launch_at=2)
        trace.kernel(GEMM, next_start, 10, launch_at=101)
        ranks.append(analyze(read_trace(trace.write(tmp_path / f"r{rank}.json"))))
    row = across_ranks(ranks)[0].row()
    assert row["max_wait_ms"] == 0 and row["waiting_rank"] is None
    assert row["slowest_rank"] == 1  # equal waits: the longer step


def test_the_last_step_ends_at_its_own_last_kernel_not_at_later_gpu_work(tmp_path: Path) -> None:
    """GPU work launched after the last step's CPU range (a final copy at 400-450, launched at 350, as a job's
    teardown or a checkpoint leaves) belongs to no step: step 3 still spans 250-290, 40 µs."""
    trace = three_steps()
    trace.kernel(COMPUTE, 400, 50, launch_at=350)
    rank = analyze(read_trace(trace.write(tmp_path / "r.json")))
    last = rank.steps[-1]
    assert last.step == 3 and last.breakdown.span_us == pytest.approx(40, rel=1e-12)
    assert last.breakdown.busy_us == pytest.approx(40, rel=1e-12)
