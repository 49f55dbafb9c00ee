"""The timed run of `stepscope op-rates`: every op of `OpRatesConfig` in rounds, its measured rate beside the rate the
performance model assumes for it, one `op-rates` record per op and variant.

The performance model times a matrix op at η(FLOPs) of the matrix peak (the system's efficiency curve) and fused
attention at `flash_efficiency` x η. A curve's top can be checked against a best-shape benchmark (mamf-finder), but
a training step runs the shapes of its model and plan: this measures exactly those (`shapes`).
- `dense`: each GEMM in its three passes as `torch.nn.Linear` runs them (forward x·Wᵀ, input gradient dY·W, weight
  gradient dYᵀ·x), in bf16 and in fp8 (`torch._scaled_mm`, per-tensor scales, on GPUs with fp8 tensor cores);
- `moe`: a padded batched matmul (what stepscope's grouped MoE path runs) and `torch._grouped_mm` where torch has
  it, forward, bf16;
- `attention`: causal scaled-dot-product attention per backend (flash, cuDNN), forward and backward.
Per dense model and precision, the FLOP-weighted ratio says how much longer the GEMMs really take than a step
prediction assumes (`summary`).

Sustained, not burst, rates: a few seconds of large products first bring the GPU to its power-limited clock
(mamf-finder's MSMF), then every op runs in rounds (all ops of a round back to back, the median over rounds).

    stepscope op-rates --system H100-SXM --out results
    stepscope calibrate --rates results --base H100-SXM --system-out mine.toml   (perfmodel/calibrate/rates.py)
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from stepscope.measure.environment import torch_environment
from stepscope.measure.op_rates.config import OpRatesConfig
from stepscope.measure.op_rates.shapes import MatrixOp
from stepscope.results.store import RecordStore, make_record
from stepscope.spec.system import load_system

KIND = "op-rates"


def _dense_thunk(op: MatrixOp, precision: str, device: torch.device) -> Callable[[], object]:
    """The product in the layout torch.nn.Linear's pass uses (fp8: row-major by column-major, as required)."""
    a = torch.randn(op.m, op.k, device=device, dtype=torch.bfloat16)
    if precision == "fp8":
        scale = torch.ones((), device=device)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = torch.randn(op.n, op.k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
        return lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    if op.direction == "forward":  # x·Wᵀ with W stored (N, K)
        w = torch.randn(op.n, op.k, device=device, dtype=torch.bfloat16)
        return lambda: torch.nn.functional.linear(a, w)
    b = torch.randn(op.k, op.n, device=device, dtype=torch.bfloat16)
    if op.direction == "input-grad":  # dY·W, both row-major
        return lambda: a @ b
    at = torch.randn(op.k, op.m, device=device, dtype=torch.bfloat16).t()  # dYᵀ·x, dY stored (tokens, out)
    return lambda: at @ b


def _grouped_thunk(op: MatrixOp, impl: str, device: torch.device) -> Callable[[], object] | None:
    """`bmm`: (groups, M, K) x (groups, K, N); `grouped_mm`: torch._grouped_mm over the rows sorted by group."""
    b = torch.randn(op.groups, op.k, op.n, device=device, dtype=torch.bfloat16)
    if impl == "bmm":
        a = torch.randn(op.groups, op.m, op.k, device=device, dtype=torch.bfloat16)
        return lambda: torch.bmm(a, b)
    if not hasattr(torch, "_grouped_mm"):
        return None
    a = torch.randn(op.groups * op.m, op.k, device=device, dtype=torch.bfloat16)
    offsets = torch.arange(1, op.groups + 1, device=device, dtype=torch.int32) * op.m
    bt = b.transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major weights, as the kernel wants them
    return lambda: torch._grouped_mm(a, bt, offs=offsets, out_dtype=torch.bfloat16)


def _attention_thunk(op: MatrixOp, backend: str, device: torch.device) -> Callable[[], object] | None:
    """Causal scaled-dot-product attention on one backend; None where torch lacks it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}[backend]
    if chosen is None:
        return None
    q, k, v = (torch.randn(1, op.n, op.m, op.k, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if op.direction == "forward":  # with autograd on: a training forward also writes the logsumexp
        def run():
            with sdpa_kernel(chosen):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return run
    with sdpa_kernel(chosen):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def _seconds_per_call(thunk: Callable[[], object], device: torch.device, min_s: float) -> float:
    """Mean time of back-to-back calls over at least `min_s` (CUDA events; wall clock on CPU). Not
    `timer.time_callable`, which synchronizes around every call to charge host overhead to a step: a kernel's
    rate needs the launches queued behind each other."""
    thunk()
    reps = 1
    while True:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                thunk()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                thunk()
            elapsed = time.perf_counter() - t0
        if elapsed >= min_s or reps >= 1 << 14:
            return elapsed / reps
        reps = max(reps * 2, int(reps * min_s / max(elapsed, 1e-9)) + 1)


def preheat(device: torch.device, seconds: float) -> float:
    """Large bf16 products for `seconds` (clocks down to the power limit); the last second's TFLOP/s."""
    n = 8192 if device.type == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    end, rate = time.perf_counter() + seconds, 0.0
    while time.perf_counter() < end:
        rate = 2.0 * n**3 / _seconds_per_call(lambda: a @ a, device, min(1.0, seconds)) / 1e12
    return rate


def _variants(op: MatrixOp, fp8: bool) -> list[str]:
    """How each op is run: precisions of a GEMM, implementations of a grouped GEMM, backends of attention."""
    if op.family == "moe":
        return ["bmm", "grouped_mm"]
    if op.family == "attention":
        return ["flash", "cudnn"]
    return ["bf16", "fp8"] if fp8 else ["bf16"]


def _thunk(op: MatrixOp, variant: str, device: torch.device) -> Callable[[], object] | None:
    if op.family == "moe":
        return _grouped_thunk(op, variant, device)
    if op.family == "attention":
        return _attention_thunk(op, variant, device)
    return _dense_thunk(op, variant, device)


def measure(ops: list[MatrixOp], system_name: str, rounds: int, min_s: float, preheat_s: float,
            device: torch.device) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Measured and modelled rate of every op and variant (a row each); the ops and variants torch refused or
    lacks (a row each, with the reason as `note`); the preheat's last TFLOP/s."""
    acc = load_system(system_name).accelerator
    fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)  # Ada/Hopper and later
    hot = preheat(device, preheat_s)
    times: dict[tuple[int, str], list[float]] = {}
    refused: dict[tuple[int, str], str] = {}
    for _ in range(rounds):
        for i, op in enumerate(ops):
            for variant in _variants(op, fp8):
                try:
                    thunk = _thunk(op, variant, device)
                    if thunk is None:
                        refused[i, variant] = f"this torch has no {variant}"
                    else:
                        seconds = _seconds_per_call(thunk, device, min_s)
                        times.setdefault((i, variant), []).append(seconds)
                except (RuntimeError, NotImplementedError) as error:  # a backend refusing a shape, or missing
                    refused[i, variant] = (str(error).splitlines() or [type(error).__name__])[0][:120]
                thunk = None
    rows = []
    for (i, variant), seconds in times.items():
        op = ops[i]
        precision = "fp8" if variant == "fp8" else "bf16"
        peak = acc.matrix_peak(precision)
        efficiency = (acc.efficiency(op.flops) * (acc.flash_efficiency if op.family == "attention" else 1.0)
                      * (acc.fp8_efficiency if precision == "fp8" else 1.0))
        measured = op.flops / statistics.median(seconds)
        rows.append({**asdict(op), "variant": variant, "GFLOP": op.flops / 1e9, "measured_TFLOPps": measured / 1e12,
                     "measured_of_peak": measured / peak, "model_TFLOPps": efficiency * peak / 1e12,
                     "model_of_peak": efficiency})
    unsupported = [{**asdict(ops[i]), "variant": variant, "note": note} for (i, variant), note in refused.items()
                   if (i, variant) not in times]
    return rows, unsupported, hot


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dense model and precision: the GEMMs' FLOP-weighted measured and modelled rates and how much longer
    they really take than the model assumes."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows if r["family"] == "dense"):
        for variant in ("bf16", "fp8"):
            mine = [r for r in rows if r["family"] == "dense" and r["model"] == model and r["variant"] == variant]
            if mine:
                flops = sum(r["flops"] for r in mine)
                real_s = sum(r["flops"] / r["measured_TFLOPps"] for r in mine) / 1e12
                model_s = sum(r["flops"] / r["model_TFLOPps"] for r in mine) / 1e12
                out.append({"model": model, "precision": variant, "measured_TFLOPps": flops / real_s / 1e12,
                            "model_TFLOPps": flops / model_s / 1e12, "measured_time_over_model": real_s / model_s})
    return out


@dataclass
class OpRatesResult:
    """What `run_op_rates` measured: a row per op and variant, the dense summary, where the records went."""

    rows: list[dict[str, Any]]
    unsupported: list[dict[str, Any]]
    """The ops and variants torch refused or lacks, each with why (`note`)."""
    summary: list[dict[str, Any]]
    device_name: str
    preheat_TFLOPps: float
    path: Path | None = None


def run_op_rates(config: OpRatesConfig, out: str | os.PathLike | None = None) -> OpRatesResult:
    """Time every op of `config` and append one `op-rates` record per op and variant to `<out>/op-rates.jsonl`
    (None: not stored). Settings, layouts, system and device are checked before the store is made."""
    from stepscope.measure.device import device_name, resolve_device

    ops = config.check()
    device = resolve_device(config.device)
    store = RecordStore(out, KIND).check_writable() if out is not None else None
    rows, unsupported, hot = measure(ops, config.system, config.rounds, config.min_batch_s, config.preheat_s, device)
    if store is not None:
        env = torch_environment(device)
        settings = {"system": config.system, "rounds": config.rounds, "min_batch_s": config.min_batch_s,
                    "preheat_s": config.preheat_s}
        for row in rows:
            metrics = {k: row[k] for k in ("flops", "GFLOP", "measured_TFLOPps", "measured_of_peak", "model_TFLOPps",
                                           "model_of_peak")}
            store.append(make_record(KIND, {**_shape(row), **settings}, {**metrics, "preheat_TFLOPps": hot}, env=env))
        for row in unsupported:
            store.append(make_record(KIND, {**_shape(row), **settings}, status="unsupported", note=row["note"],
                                     env=env))
    return OpRatesResult(rows, unsupported, summary(rows), device_name(device), hot, store.path if store else None)


def _shape(row: dict[str, Any]) -> dict[str, Any]:
    """What identifies a row's op and variant (its record's config, with the settings)."""
    return {k: row[k] for k in ("family", "model", "op", "direction", "m", "k", "n", "groups", "variant")}
