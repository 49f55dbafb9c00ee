"""The roofline against hand-computed values on a generated trace, and against an independent computation on the
shared GPU traces that carry shapes (FLOPs from `Input Dims`, time of the kernels each op launched, found here
by time containment on the launching thread from the raw JSON, not by the code under test)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.traces.peaks import device_peaks
from stepscope.traces.read import read_trace
from stepscope.traces.roofline import roofline, totals
from tests.traces.kineto import TraceBuilder

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _op(trace: TraceBuilder, name: str, start: float, dur: float, dims: list, types: list,
        concrete: list | None = None) -> None:
    trace.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": start, "dur": dur,
                         "args": {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or []}})


def test_linear_counts_its_addmm_kernel_once_and_attention_is_causal(tmp_path: Path) -> None:
    trace = TraceBuilder()
    trace.meta["deviceProperties"] = [{"name": "NVIDIA H100 80GB HBM3"}]
    bf16 = "c10::BFloat16"
    _op(trace, "aten::linear", 0, 20, [[64, 128], [256, 128], [256]], [bf16] * 3)
    _op(trace, "aten::addmm", 1, 18, [[256], [64, 128], [128, 256], [], []], [bf16] * 3 + ["Scalar"] * 2)
    trace.kernel("sm90_xmma_gemm_bf16", 5, 10.0, launch_at=2)
    sdpa = [[2, 4, 256, 64]] * 3 + [[], [], [], [], [], []]
    _op(trace, "aten::_scaled_dot_product_flash_attention", 30, 10, sdpa, [bf16] * 3 + ["Scalar"] * 3,
        ["", "", "", "0.", "True", "False", ""])
    trace.kernel("flash_fwd_kernel", 40, 4.0, launch_at=31)
    trace.kernel("flash_fwd_kernel", 44, 4.0, launch_at=32)
    rows = {row.op: row for row in roofline(read_trace(trace.write(tmp_path / "t.json")))}
    assert set(rows) == {"aten::addmm", "aten::_scaled_dot_product_flash_attention"}
    gemm = rows["aten::addmm"]
    assert gemm.flops == 2 * 64 * 128 * 256 and gemm.time_us == 10 and gemm.kernels == 1
    assert gemm.bytes == 2 * (256 + 64 * 128 + 128 * 256 + 64 * 256)
    peaks = device_peaks("NVIDIA H100 80GB HBM3")
    metrics = gemm.metrics(peaks)
    assert metrics["TFLOPps"] == pytest.approx(2 * 64 * 128 * 256 / 10e-6 / 1e12)
    assert metrics["peak_pct"] == pytest.approx(100 * metrics["TFLOPps"] / 989.0)
    attention = rows["aten::_scaled_dot_product_flash_attention"]
    assert attention.flops == 4 * 2 * 4 * 256 * 256 * 64 * 0.5 and attention.time_us == 8 and attention.kernels == 2


def test_a_cpu_trace_counts_only_the_innermost_costed_ops(tmp_path: Path) -> None:
    trace = TraceBuilder(rank=None).step(1, 0, 100)
    trace.cpu_op("stepscope.forward", 0, 60)
    _op(trace, "aten::linear", 1, 40, [[8, 16], [32, 16]], ["float", "float"])
    _op(trace, "aten::mm", 2, 30, [[8, 16], [16, 32]], ["float", "float"])
    rows = roofline(read_trace(trace.write(tmp_path / "cpu.json")))
    assert [(r.op, r.time_us, r.flops) for r in rows] == [("aten::mm", 30, 2 * 8 * 16 * 32)]


def _independent_gemm_tflops(path: Path) -> float:
    """Σ FLOPs / Σ kernel time over aten::mm/addmm/bmm/baddbmm, from the raw events."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]]
    kernels = {e["args"]["correlation"]: e["dur"] for e in events if e.get("cat") == "kernel"}
    flops = seconds = 0.0
    for op in events:
        if op.get("cat") != "cpu_op" or op["name"] not in GEMMS or "Input Dims" not in op.get("args", {}):
            continue
        dims = [d for d in op["args"]["Input Dims"] if d]
        a, b = (dims[1], dims[2]) if op["name"] in ("aten::addmm", "aten::baddbmm") else (dims[0], dims[1])
        batch = a[0] if len(a) == 3 else 1
        time = sum(kernels.get(call["args"]["correlation"], 0.0) for call in launches
                   if call["tid"] == op["tid"] and op["ts"] <= call["ts"] <= op["ts"] + op["dur"])
        if time > 0:
            flops += 2.0 * batch * a[-2] * a[-1] * b[-1]
            seconds += time / 1e6
    return flops / seconds / 1e12


@pytest.mark.parametrize("name", ["128rank-sampled-rank0.json.gz", "128rank-sampled-rank1.json.gz",
                                  "mi250-toy-train.json.gz"])
def test_gemm_tflops_agree_with_an_independent_count_on_real_traces(name: str) -> None:
    if not (SHARED / name).exists():
        pytest.skip("../shared/traces is absent")
    rows = [r for r in roofline(read_trace(SHARED / name)) if r.op in GEMMS]
    ours = sum(r.flops for r in rows) / (sum(r.time_us for r in rows) / 1e6) / 1e12
    assert ours == pytest.approx(_independent_gemm_tflops(SHARED / name), rel=0.03)
    line = [t for t in totals(roofline(read_trace(SHARED / name)), device_peaks("")) if t["family"] == "gemm"]
    assert sum(t["GFLOP"] for t in line) >= sum(r.flops for r in rows) / 1e9 * (1 - 1e-9)
