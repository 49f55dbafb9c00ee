from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.traces.analyze import analyze
from stepscope.traces.kinds import collective_kind, hta_type, kernel_category
from stepscope.traces.read import read_trace
from tests.traces.kineto import COMPUTE, GEMM, NCCL, TraceBuilder, two_step_rank


def test_kinds_follow_hta_and_stepscope_categories() -> None:
    assert hta_type(NCCL) == "communication" and hta_type("Memcpy DtoH (Device -> Pinned)") == "memory"
    assert hta_type("Context Sync") == "other" and hta_type(GEMM) == "computation"
    assert kernel_category(GEMM) == "matmul" and kernel_category(NCCL) == "communication"
    assert kernel_category("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>(int)") == "normalization"
    assert kernel_category("Cijk_Alik_Bljk_SB_MT64x16x32") == "matmul"
    assert collective_kind(NCCL) == "all_reduce" and collective_kind(GEMM) is None


def test_breakdown_of_a_known_timeline(tmp_path: Path) -> None:
    rank = analyze(read_trace(two_step_rank().write(tmp_path / "r.json")))
    total = rank.total.breakdown  # step 1 only: HTA leaves the last step out of the totals
    assert total.span_us == 80 and total.busy_us == 80 and total.idle_us == 0
    assert total.compute_us == 60 and total.comm_us == 30 and total.comm_overlapped_us == 10
    assert total.overlap_pct == pytest.approx(100 / 3) and total.comm_exposed_us == 20
    assert [w.step for w in rank.steps] == [1, 2]
    first, last = rank.steps
    assert first.breakdown.span_us == 100 and first.breakdown.idle_us == 20  # runs to the next step's first kernel
    assert last.breakdown.span_us == 80
    assert first.collectives == {"all_reduce": [1, 30.0]}
    assert first.categories == {"matmul": 40.0, "communication": 30.0, "elementwise": 20.0}
    assert first.cpu_step_us == 100 and first.kernels == 3


def test_launch_bound_kernels_and_queue(tmp_path: Path) -> None:
    trace = TraceBuilder().step(1, 0, 100)
    for i in range(4):  # each 5 µs kernel took 10 µs to launch: the GPU waits for the CPU
        trace.kernel(COMPUTE, 2 + 10 * i, 5, launch_at=10 * i, launch_dur=10)
    window = analyze(read_trace(trace.write(tmp_path / "t.json"))).steps[0]
    metrics = window.metrics(launch_bound_share=0.5)
    assert metrics["launch_bound_kernels"] == 4 and metrics["launch_bound"] is True
    assert metrics["queue_max"] == 1


def test_float_times_are_rounded_inward_as_hta_does(tmp_path: Path) -> None:
    trace = TraceBuilder().kernel(COMPUTE, 0.4, 10.2, launch_at=0).kernel(COMPUTE, 20.5, 4.0, launch_at=1)
    total = analyze(read_trace(trace.write(tmp_path / "t.json"))).total.breakdown
    assert total.span_us == 24 - 1 and total.busy_us == 9 + 3  # [1, 10] and [21, 24]


def test_a_kernel_is_categorized_by_its_own_name_not_its_argument_types() -> None:
    name = "void split_embedding_codegen_forward_kernel<c10::Half>(fbgemm_gpu::TensorAccessor<float>)"
    assert kernel_category(name) == "memory copy"


def test_host_syncs_on_stream_minus_one_are_not_gpu_time(tmp_path: Path) -> None:
    # Kineto's Event Sync / Context Sync: a host waiting, on stream -1; HTA leaves them out of the timeline
    trace = TraceBuilder().kernel(GEMM, 0, 10, launch_at=0).kernel("Event Sync", 30, 40, launch_at=1, stream=-1)
    total = analyze(read_trace(trace.write(tmp_path / "t.json"))).total.breakdown
    assert total.span_us == 10 and total.busy_us == 10


def test_malformed_names_and_out_of_range_ids_read_without_a_traceback(tmp_path: Path) -> None:
    trace = TraceBuilder().kernel(GEMM, 0, 10, launch_at=0).kernel(COMPUTE, 10, 5, launch_at=1)
    trace.events[1]["name"] = None  # a kernel without a name
    trace.events[4]["args"]["stream"] = 2**64 - 1  # uint64 -1: a host sync
    trace.events.append({"ph": "X", "cat": "cpu_op", "name": 5, "ts": 0, "dur": 1, "args": {"correlation": 1e30}})
    total = analyze(read_trace(trace.write(tmp_path / "t.json"))).total.breakdown
    assert total.span_us == 10 and total.busy_us == 10


def test_only_kernels_count_as_launch_bound(tmp_path: Path) -> None:
    # a stream sync and a copy whose host call blocks by design are no launch-bound kernels
    trace = TraceBuilder().step(1, 0, 100).kernel(GEMM, 0, 50, launch_at=0)
    trace.kernel("Stream Sync", 50, 1, launch_at=2, launch_dur=40).kernel("Memcpy DtoH (Device -> Pinned)", 52, 2,
                                                                           launch_at=45, launch_dur=30)
    metrics = analyze(read_trace(trace.write(tmp_path / "t.json"))).steps[0].metrics(launch_bound_share=0.5)
    assert metrics["kernels"] == 1 and metrics["launch_bound_kernels"] == 0 and metrics["launch_bound"] is False


def test_step_windows_never_run_backwards(tmp_path: Path) -> None:
    # step 2's copy starts on another stream before step 1's last kernels: windows stay non-negative
    trace = TraceBuilder().step(1, 0, 10).step(2, 10, 20).step(3, 20, 30)
    trace.kernel(GEMM, 100, 50, launch_at=1).kernel("Memcpy HtoD (Pageable -> Device)", 50, 5, launch_at=11,
                                                   stream=9)
    trace.kernel(GEMM, 150, 50, launch_at=12).kernel(GEMM, 200, 50, launch_at=21)
    steps = analyze(read_trace(trace.write(tmp_path / "t.json"))).steps
    assert [w.step for w in steps] == [1, 2, 3] and all(w.breakdown.span_us >= 0 for w in steps)


def test_waiting_matches_collectives_in_launch_order_not_file_order(tmp_path: Path) -> None:
    from stepscope.traces.ranks import across_ranks

    gather = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)"
    ranks = []
    for rank in (0, 1):
        trace = TraceBuilder(rank, 2).step(1, 0, 100).step(2, 100, 200)
        calls = [(NCCL, 0, 10, 1, 7), (gather, 20, 50, 2, 9)]  # the same two collectives, listed in two orders
        for name, start, dur, launch, stream in (calls if rank == 0 else calls[::-1]):
            trace.kernel(name, start, dur, launch_at=launch, stream=stream)
        trace.kernel(GEMM, 100, 10, launch_at=101)
        ranks.append(analyze(read_trace(trace.write(tmp_path / f"r{rank}.json"))))
    step = across_ranks(ranks)[0]
    assert step.wait_ms == {0: 0.0, 1: 0.0}
