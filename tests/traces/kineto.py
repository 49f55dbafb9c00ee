"""Tiny Kineto-like traces written by the tests: a CPU step range, launches and kernels with correlation ids."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

COMPUTE = "void at::native::vectorized_elementwise_kernel<4>(int)"
GEMM = "sm80_xmma_gemm_f32f32_tn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"


class TraceBuilder:
    """Events of one rank; `kernel` adds a launch on the CPU and the kernel on a GPU stream."""

    def __init__(self, rank: int | None = 0, world_size: int | None = 1) -> None:
        self.events: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU"}]}
        if rank is not None:
            self.meta["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
        self._corr = 0

    def step(self, number: int, start: float, end: float) -> TraceBuilder:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1,
                            "tid": 1, "ts": start, "dur": end - start, "args": {}})
        return self

    def kernel(self, name: str, start: float, dur: float, launch_at: float, launch_dur: float = 1.0,
               stream: int = 7) -> TraceBuilder:
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": launch_at, "dur": launch_dur, "args": {"correlation": self._corr}})
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start,
                            "dur": dur, "args": {"stream": stream, "correlation": self._corr, "device": 0}})
        self.events.append({"ph": "s", "cat": "ac2g", "id": self._corr, "pid": 1, "tid": 1, "ts": launch_at})
        return self

    def cpu_op(self, name: str, start: float, dur: float, tid: int = 1) -> TraceBuilder:
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": start, "dur": dur,
                            "args": {}})
        return self

    def write(self, path: Path) -> Path:
        text = json.dumps({**self.meta, "traceEvents": self.events}, indent=1).encode()
        path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
        return path


def two_step_rank(rank: int = 0, world_size: int = 1, slow: float = 0.0) -> TraceBuilder:
    """Two steps of 100 µs (plus `slow`): per step a 40 µs GEMM, then a 30 µs all-reduce of which 10 µs run under a
    20 µs elementwise kernel on another stream; 30 µs idle. The rank totals are step 1 only (HTA leaves out the
    last step), span 80 µs (GPU events 0..80)."""
    trace = TraceBuilder(rank, world_size)
    for index, step in enumerate((1, 2)):
        base = index * (100.0 + slow)
        trace.step(step, base, base + 100 + slow)
        trace.kernel(GEMM, base, 40, launch_at=base + 1)
        trace.kernel(NCCL, base + 40 + slow, 30 + 0.0, launch_at=base + 2)
        trace.kernel(COMPUTE, base + 60 + slow, 20, launch_at=base + 3, stream=9)
    return trace
