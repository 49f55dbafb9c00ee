"""From op counts to seconds on one device: the roofline of one op direction, over numpy arrays. An op takes
max(compute, memory) + kernels x overhead; a GEMM's efficiency is the system's curve at its FLOPs x K/(K + K0) x
its tile and wave quantization, times `flash_efficiency` for fused attention and `fp8_efficiency` for fp8 GEMMs;
a GPU capped below its rated power runs its matrix ops at a lower clock.

The formulas, their sources and the measured constants: docs/model.md, "Time on one device".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.perfmodel.model.op_types import Cost
from stepscope.spec.stack import StackSpec
from stepscope.spec.system import Accelerator, SystemSpec


@dataclass(frozen=True)
class OpTime:
    """Time of one direction of an op, split into its roofline terms (arrays, one element per plan)."""

    compute_s: Any
    memory_s: Any
    overhead_s: Any

    @property
    def total_s(self) -> Any:
        return np.maximum(self.compute_s, self.memory_s) + self.overhead_s


def efficiency(accelerator: Accelerator, flops_per_kernel: Any) -> Any:
    """Fraction of the matrix peak an op of `flops_per_kernel` FLOPs reaches (the module docstring's curve)."""
    knots = accelerator.matrix_efficiency_by_GFLOP
    xs = [math.log10(size) for size, _ in knots]
    inverse = np.interp(np.log10(np.maximum(flops_per_kernel, 1.0) / 1e9), xs, [1.0 / eta for _, eta in knots])
    return 1.0 / inverse


MAX_CURVE = 0.95
"""A scaled efficiency curve stays at or below 95 % of the peak (cuBLAS's best large GEMMs on H100/A100)."""


def scale_curve(system: SystemSpec, factor: float) -> SystemSpec:
    """`system` with every knot of its efficiency curve times `factor`, capped at MAX_CURVE. Fused attention
    follows: its efficiency is `flash_efficiency` times the curve's, so it must not be scaled again."""
    acc = system.accelerator
    curve = tuple((gflop, min(MAX_CURVE, eff * factor)) for gflop, eff in acc.matrix_efficiency_by_GFLOP)
    return system.replace(accelerator=dataclasses.replace(acc, matrix_efficiency_by_GFLOP=curve))


def on_stack(system: SystemSpec, stack: StackSpec) -> SystemSpec:
    """`system` as `stack` runs on it: its fused attention at FlashAttention-2's rate where the stack runs that
    kernel and the accelerator states its rate (`Accelerator.flash2_efficiency`), its curve times the stack's
    `compute_efficiency`."""
    acc = system.accelerator
    if stack.attention == "flash-attention-2" and acc.flash2_efficiency:
        system = system.replace(accelerator=dataclasses.replace(acc, flash_efficiency=acc.flash2_efficiency))
    return scale_curve(system, stack.compute_efficiency) if stack.compute_efficiency != 1.0 else system


STATIC_POWER_W = 100.0
"""Board power that does not scale with the SM clock (idle, HBM, static leakage; the module docstring)."""


def power_scale(accelerator: Accelerator) -> float:
    """The sustained matrix rate at the accelerator's power limit over the one its rates were measured at."""
    limit, rated = accelerator.power_limit_W, accelerator.rated_power_W or accelerator.power_limit_W
    if not limit or limit == rated:
        return 1.0
    return math.sqrt(max(limit - STATIC_POWER_W, 0.0) / (rated - STATIC_POWER_W))


TILES = ((128, 128), (128, 256), (256, 128))
"""Output tile shapes of Hopper-class GEMM kernels (cuBLAS `nvjet_sm90`, CUTLASS, DeepGEMM's candidates)."""


def tiling(accelerator: Accelerator, m: Any, n: Any, groups: Any = 1) -> Any:
    """Useful share of the launched tiles of G GEMMs of m x n outputs: the best of `TILES` by tile and wave
    quantization on the accelerator's SMs (1 where the SM count is unknown)."""
    if not accelerator.sm_count:
        return 1.0
    sms = accelerator.sm_count
    best = 0.0
    for bm, bn in TILES:
        tiles = groups * np.ceil(m / bm) * np.ceil(n / bn)
        best = np.maximum(best, m * n * groups / (np.maximum(np.ceil(tiles / sms), 1) * sms * bm * bn))
    return best


def gemm_efficiency(accelerator: Accelerator, precision: str, m: Any, n: Any, k: Any, groups: Any = 1) -> Any:
    """η of G GEMMs of m x n outputs and inner dimension k in `precision` (the module docstring's product; the
    fp8 factor aside)."""
    k0 = accelerator.gemm_k0.get(precision, accelerator.gemm_k0.get("bf16", 0.0) if precision == "fp16" else 0.0)
    return (efficiency(accelerator, 2.0 * m * n * k * groups) * k / (k + k0)
            * tiling(accelerator, m, n, groups))


def matrix_compute(cost: Cost, kind: str, accelerator: Accelerator, precision: str, chunks: Any = 1,
                   concurrent: Any = 1) -> Any:
    """Compute seconds of a matrix or fused-attention op direction; with `chunks`, of its GEMMs split into that many
    GEMMs of 1/chunks of the rows each, `concurrent` of them sharing the GPU's waves at a time (on as many streams:
    what overlapping them with communication does, `tensor_overlap.py`)."""
    factor = accelerator.flash_efficiency if kind == "attention" else 1.0
    if precision == "fp8":
        factor = factor * accelerator.fp8_efficiency
    peak = accelerator.matrix_peak(precision) * factor * power_scale(accelerator)
    if cost.gemms:
        together = np.minimum(concurrent, chunks)
        return sum(2.0 * m * n * k * g / (peak * gemm_efficiency(accelerator, precision, m / chunks, n, k,
                                                                 g * together))
                   for m, n, k, g in cost.gemms)
    return cost.flops / (peak * efficiency(accelerator, cost.flops / np.maximum(cost.kernels, 1)))


def chunked_compute(cost: Cost, accelerator: Accelerator, precision: str, chunks: Any, concurrent: Any = 1) -> Any:
    """`matrix_compute` of a GEMM op split into `chunks` GEMMs along its rows, `concurrent` at a time."""
    return matrix_compute(cost, "matrix", accelerator, precision, chunks, concurrent)


def op_time(cost: Cost, kind: str, accelerator: Accelerator, precision: str) -> OpTime:
    """Roofline time of one op direction on `accelerator`; `kind` matrix, attention (a fused attention kernel) or
    vector, `precision` the one it computes in (fp8 for the GEMMs of fp8 training)."""
    if kind == "vector":
        compute = cost.flops / accelerator.vector_peak(precision)
    else:
        compute = matrix_compute(cost, kind, accelerator, precision)
    memory = cost.bytes / accelerator.memory_bytes_per_s
    return OpTime(compute, memory, cost.kernels * accelerator.kernel_overhead_us * 1e-6 + cost.latency_s)
