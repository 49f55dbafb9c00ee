"""`stepscope trace --tally`: THAPI's host / device / memory tables from Kineto traces — exact counts on a small
generated trace, and the tables of a real shared GPU trace when `../shared/traces` is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.results.store import read_records
from tests.traces.kineto import GEMM, NCCL, TraceBuilder

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


def _rank_trace(rank: int) -> TraceBuilder:
    """Two all-reduces of 1,000,000 fp32 elements and one of 256, a GEMM, a 4 MB copy and a memset."""
    trace = TraceBuilder(rank, world_size=2)
    trace.kernel(GEMM, 0, 40, launch_at=1)
    for start, nelems in ((50, 1_000_000), (150, 1_000_000), (250, 256)):
        trace.kernel(NCCL, start, 30, launch_at=2)
        trace.events[-2]["args"].update({"Collective name": "allreduce", "In msg nelems": nelems, "dtype": "Float"})
    for cat, name, nbytes in (("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 4_000_000),
                              ("gpu_memset", "Memset (Device)", 512)):
        trace.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync" if "cpy" in name else
                             "cudaMemsetAsync", "pid": 1, "tid": 2, "ts": 300, "dur": 5, "args": {"correlation": 99}})
        trace.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 310, "dur": 10,
                             "args": {"stream": 7, "bytes": nbytes, "correlation": 99}})
    return trace


def test_exact_tables_of_a_generated_trace(cli, tmp_path):
    paths = [_rank_trace(rank).write(tmp_path / f"rank{rank}.json.gz") for rank in (0, 1)]
    code, stdout, stderr = cli("trace", *paths, "--tally", "--out", tmp_path / "r")
    assert code == 0, stderr
    assert "r0 = rank0.json.gz: NCCL rank 0 | - Hostnames | 1 Processes | 2 Threads" in stdout
    records = read_records(tmp_path / "r" / "trace-tally.jsonl")
    assert [r["config"]["rank"] for r in records] == [0, 1]
    m = records[0]["metrics"]
    assert m["host"]["cudaLaunchKernel"] == [4, 4.0]  # four launches of 1 µs
    assert m["device"]["nccl: ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == [3, 90.0]
    assert m["memory"]["Memcpy HtoD (Pinned -> Device)"] == [1, 4_000_000, 10.0]
    assert m["memory"]["Memset (Device)"] == [1, 512, 10.0]
    assert m["collectives"] == [["all_reduce", 1024, 1, 30.0], ["all_reduce", 4_000_000, 2, 60.0]]
    code, stdout, _ = cli("trace", *paths, "--tally", "--format", "json", "--no-plot")
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert {(r["rank"], r["table"]) for r in rows} >= {(0, "host"), (1, "collectives"), (1, "memory")}


@pytest.mark.skipif(not (SHARED / "a100-2rank-rank0.json.gz").exists(), reason="shared GPU traces not here")
def test_a_real_nccl_trace_yields_the_three_tables(cli, tmp_path):
    code, stdout, stderr = cli("trace", SHARED / "a100-2rank-rank0.json.gz", "--tally", "--out", tmp_path)
    assert code == 0, stderr
    m = read_records(tmp_path / "trace-tally.jsonl")[0]["metrics"]
    kernels = sum(v[0] for v in m["device"].values())
    assert kernels == 2700  # the README of the shared traces: 2,700 kernels
    assert m["device"]["nccl: ncclKernel_AllReduce_RING_LL_Sum_float"][0] == 15
    assert sum(v[0] for v in m["memory"].values()) == 960 + 114  # gpu_memcpy and gpu_memset events
    assert m["host"]["cudaLaunchKernel"][0] > 0 and all(row[0] == "all_reduce" or row[0] == "broadcast"
                                                        for row in m["collectives"])


def test_a_file_with_no_profiler_events_is_refused(cli, tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    code, _, err = cli("trace", str(empty), "--tally", "--out", tmp_path / "out")
    # a refused command leaves nothing behind
    assert code == 2 and "no profiler events to tally" in err and not (tmp_path / "out").exists()
    code, _, err = cli("trace", str(empty), "--launch-bound-share", "1.5", "--out", tmp_path / "out")
    assert code == 2 and "--launch-bound-share must be at least 0 and below 1" in err
