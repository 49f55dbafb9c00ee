"""The critical path of a step, on one rank and across ranks, against paths worked out by hand (the µs in the
comments), on tiny traces whose ranks' clocks differ (rank 1 runs 1000 µs later: no common clock is used)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.traces.analyze import analyze
from stepscope.traces.config import TraceConfig
from stepscope.traces.critical_path_ranks import job_paths
from stepscope.traces.read import read_trace
from stepscope.traces.run import run_trace
from tests.traces.kineto import COMPUTE, GEMM, NCCL, TraceBuilder

GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)"


def test_one_rank_path_goes_through_the_host_and_a_blocking_sync(tmp_path: Path) -> None:
    trace = TraceBuilder().step(1, 0, 100)
    trace.kernel(GEMM, 5, 10, launch_at=0, launch_dur=5)  # A: 5..15, off the path
    trace.kernel(COMPUTE, 25, 5, launch_at=20, launch_dur=5)  # B: 25..30, launched late (host work 0..25)
    trace.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                         "ts": 30, "dur": 10, "args": {"correlation": 99}})  # waits for B, returns at 40
    trace.kernel(GEMM, 45, 20, launch_at=40, launch_dur=5)  # C: 45..65, the last
    path = analyze(read_trace(trace.write(tmp_path / "r.json"))).critical_path[0]
    # C 20 matmul; its launch 40..45 and the sync 30..40 are cpu; B 5 elementwise; B's launch back to 0: 25 cpu
    assert path.path_ms == pytest.approx(0.065)
    assert path.categories == pytest.approx({"matmul": 0.020, "cpu": 0.040, "elementwise": 0.005})
    assert path.bound_by == "cpu"


def _rank(rank: int, offset: float, gemm: float, reduce: tuple[float, float], vector: float,
          gather: tuple[float, float], tail: float, gather_kernel: bool = True) -> TraceBuilder:
    """One step on one stream: GEMM, all-reduce, elementwise, all-gather, GEMM (times relative to the step)."""
    trace = TraceBuilder(rank, 2).step(1, offset, offset + 200)
    at = offset + 2
    trace.kernel(GEMM, at, gemm, launch_at=offset + 1)
    trace.kernel(NCCL, reduce[0] + offset, reduce[1], launch_at=offset + 3)
    end = reduce[0] + reduce[1] + offset
    trace.kernel(COMPUTE, end, vector, launch_at=offset + 4)
    if gather_kernel:
        trace.kernel(GATHER, gather[0] + offset, gather[1], launch_at=offset + 5)
        end = gather[0] + gather[1] + offset
    else:
        end += vector
    trace.kernel(GEMM, end, tail, launch_at=offset + 6)
    return trace


def _two_ranks(tmp_path: Path, gather_kernel: bool = True) -> list[Path]:
    # rank 0 arrives at the all-reduce at 32 and waits 30 of its 40 µs; rank 1 arrives at 62 (1062) and moves the
    # data in 10; at the all-gather rank 0 arrives 10 after the all-reduce's end and waits 20, rank 1 arrives 30 after
    # and takes 8; then rank 0's tail is 10, rank 1's 5
    zero = _rank(0, 0.0, 30, (32, 40), 10, (82, 28), 10)
    one = _rank(1, 1000.0, 60, (62, 10), 30, (102, 8), 5, gather_kernel)
    return [zero.write(tmp_path / "r0.json"), one.write(tmp_path / "r1.json")]


def test_path_across_ranks_takes_the_latest_rank_at_each_collective(tmp_path: Path) -> None:
    ranks = [analyze(read_trace(path)) for path in _two_ranks(tmp_path)]
    assert [r.critical_path[0].path_ms for r in ranks] == pytest.approx([0.120, 0.115])
    (path,) = job_paths(ranks)
    # (max arrival 62 + transfer 10) + (max arrival 30 + transfer 8) + max tail 10 = 120 µs: rank 0's step
    assert path.path_ms == pytest.approx(0.120)
    # rank 1's arrivals: GEMM 60 after 2 µs of launching on its host, then the elementwise 30; rank 0's tail GEMM 10
    assert path.categories == pytest.approx({"matmul": 0.070, "cpu": 0.002, "elementwise": 0.030,
                                             "communication": 0.018})
    assert path.set_by == pytest.approx({1: 0.092, 0: 0.010})
    row = path.row()
    assert row["slowest_rank"] == 1 and row["slowest_rank_pct"] == pytest.approx(100 * 92 / 120)


def test_ranks_whose_collectives_differ_have_no_path_across_ranks(tmp_path: Path) -> None:
    ranks = [analyze(read_trace(path)) for path in _two_ranks(tmp_path, gather_kernel=False)]
    assert job_paths(ranks) == []


def test_parallel_workers_give_what_one_process_gives(tmp_path: Path) -> None:
    paths = tuple(str(p) for p in _two_ranks(tmp_path))
    serial = run_trace(TraceConfig(paths=paths, workers=1))
    parallel = run_trace(TraceConfig(paths=paths, workers=2))
    assert parallel.step_rows() == serial.step_rows()
    assert parallel.critical_path_rows() == serial.critical_path_rows()
    assert parallel.job_path_rows() == serial.job_path_rows() and len(serial.job_path_rows()) == 1
