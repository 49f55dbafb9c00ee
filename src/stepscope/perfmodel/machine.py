"""`Machine`: a system's rates unpacked once for array arithmetic, and the element-wise op-time and collective
formulas of `timing.py` and `collectives.py` that the vectorized evaluator uses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepscope.spec.system import SystemSpec


@dataclass
class Machine:
    """The system's rates, unpacked once for array arithmetic."""

    peak: float
    vector_peak: float
    optimizer_peak: float
    bandwidth: float
    overhead: float
    flash_efficiency: float
    knots_x: np.ndarray
    knots_inverse: np.ndarray
    domain: int
    intra_bw: float
    intra_lat: float
    inter_bw: float
    inter_lat: float

    @classmethod
    def of(cls, system: SystemSpec, precision: str) -> Machine:
        acc, net = system.accelerator, system.network
        knots = acc.matrix_efficiency_by_GFLOP
        optimizer_peak = acc.vector_peak("fp32") if "fp32" in acc.vector_TFLOPps else acc.vector_peak(precision)
        return cls(acc.matrix_peak(precision), acc.vector_peak(precision), optimizer_peak, acc.memory_bytes_per_s,
                   acc.kernel_overhead_us * 1e-6, acc.flash_efficiency,
                   np.array([math.log10(k[0]) for k in knots]), np.array([1.0 / k[1] for k in knots]),
                   net.domain_size, net.intra.bytes_per_s, net.intra.latency_s, net.inter.bytes_per_s,
                   net.inter.latency_s)

    # ---- op times: (compute, total) -------------------------------------------------------------
    def matrix(self, flops, moved, kernels, factor=1.0):
        per_kernel = np.maximum(flops / kernels, 1.0)
        inverse = np.interp(np.log10(per_kernel / 1e9), self.knots_x, self.knots_inverse)
        compute = flops * inverse / (self.peak * factor)
        return compute, np.maximum(compute, moved / self.bandwidth) + kernels * self.overhead

    def vector(self, flops, moved, kernels):
        compute = flops / self.vector_peak
        return compute, np.maximum(compute, moved / self.bandwidth) + kernels * self.overhead

    # ---- collectives (collectives.py, element-wise) ----------------------------------------------
    def all_reduce(self, nbytes, n, g):
        domains = np.ceil(n / g)
        ring = (2 * (g - 1) / g * nbytes / self.intra_bw + 2 * (g - 1) * self.intra_lat
                + 2 * (domains - 1) / domains * (nbytes / g) / self.inter_bw + 2 * (domains - 1) * self.inter_lat)
        intra = g >= n
        steps = 2 * np.ceil(np.log2(np.maximum(n, 1)))
        tree = np.where(intra, steps * self.intra_lat + 2 * nbytes / self.intra_bw,
                        steps * self.inter_lat + 2 * nbytes / self.inter_bw)
        return np.where(n > 1, np.minimum(ring, tree), 0.0)

    def reduce_scatter(self, nbytes, n, g):
        domains = np.ceil(n / g)
        t = ((g - 1) / g * nbytes / self.intra_bw + (g - 1) * self.intra_lat
             + (domains - 1) / domains * (nbytes / g) / self.inter_bw + (domains - 1) * self.inter_lat)
        return np.where(n > 1, t, 0.0)

    def p2p(self, nbytes, same_domain):
        return np.where(same_domain, self.intra_lat + nbytes / self.intra_bw, self.inter_lat + nbytes / self.inter_bw)
