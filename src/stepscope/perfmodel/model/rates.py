"""From op counts to seconds on one device: the roofline of one op direction, over numpy arrays.

An op takes max(compute, memory) + kernels x overhead, where compute = FLOPs / (peak·η(FLOPs per kernel)) for
matrix ops (η from the system's efficiency curve, times `flash_efficiency` for fused attention and
`fp8_efficiency` for fp8 GEMMs) and FLOPs / vector peak for elementwise ops; memory = bytes / (HBM bandwidth ·
efficiency). The curve `matrix_efficiency_by_GFLOP` is interpolated harmonically in log10(size): 1/η is linear in
log10(size) between knots and clamped outside them (`spec.system`), which keeps an op's time linear in the knots'
1/η, what `calibrate` fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.perfmodel.model.op_types import Cost
from stepscope.spec.system import Accelerator


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


def op_time(cost: Cost, kind: str, accelerator: Accelerator, precision: str) -> OpTime:
    """Roofline time of one op direction on `accelerator`; `kind` matrix, attention (a fused attention kernel) or
    vector, `precision` the one it computes in (fp8 for the GEMMs of fp8 training)."""
    if kind == "vector":
        compute = cost.flops / accelerator.vector_peak(precision)
    else:
        eta = efficiency(accelerator, cost.flops / np.maximum(cost.kernels, 1))
        if kind == "attention":
            eta = eta * accelerator.flash_efficiency
        if precision == "fp8":
            eta = eta * accelerator.fp8_efficiency
        compute = cost.flops / (accelerator.matrix_peak(precision) * eta)
    memory = cost.bytes / accelerator.memory_bytes_per_s
    return OpTime(compute, memory, cost.kernels * accelerator.kernel_overhead_us * 1e-6)
