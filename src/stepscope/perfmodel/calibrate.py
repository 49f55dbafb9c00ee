"""Fit a system to stepscope's own measurements and return it as a SystemSpec (written out as TOML).

From step records (forward / backward / optimizer medians of single-process steps):
- the matrix peak per precision is the host's measured large-GEMM rate (`gemm_GFLOPps` in the records);
- the efficiency curve (1/η at each knot, kept non-increasing with op size and η ≤ `max_efficiency`),
  the per-kernel overhead, the streaming bandwidth and the elementwise rate are fitted together by
  non-negative least squares on the relative error of every measured phase, with a weak pull of the last
  three toward the base system (`PRIOR_WEIGHT`). Each op's time is max(compute, memory) + overhead:
  elementwise ops are split into memory- and compute-bound at every possible FLOP/byte threshold, matrix
  ops are re-assigned with the current parameters until stable, and the best split wins.
From attention records (when present): `flash_efficiency` = median of the curve's time for a fused
attention kernel over the measured time. From comm records (when present): the intra-domain link's α and
bandwidth, converting each α–β fit of a ring collective over n ranks to per-step latency and link rate.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Sequence

import numpy as np

from stepscope.errors import UsageError
from stepscope.perfmodel.nnls import nnls
from stepscope.perfmodel.ops import Cost, Geometry, attention_ops, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.records import AttentionPoint, CommPoint, RecordSet, StepPoint
from stepscope.perfmodel.timing import OPTIMIZER_FLOPS_PER_PARAM, optimizer_bytes_per_param
from stepscope.spec import ModelSpec, bytes_per_element
from stepscope.spec.system import Accelerator, NetworkTier, SystemSpec

DEFAULT_KNOTS_GFLOP = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
# Weight of the pull toward the base system's elementwise rate, bandwidth and kernel overhead, in units of
# one phase's relative error: records that barely constrain these (e.g. all phases GEMM-bound) leave them
# near the base instead of at an unphysical extreme; records that do constrain them win.
PRIOR_WEIGHT = 0.01


@dataclass(frozen=True)
class Calibration:
    """The fitted system and how well it explains the records it was fitted on."""

    system: SystemSpec
    points: list[StepPoint]
    parameters: dict[str, float]
    iterations: int
    notes: list[str] = field(default_factory=list)


def _terms(point: StepPoint) -> dict[str, list[tuple[str, Cost, float]]]:
    """(kind, cost, count) of every op of each measured phase of a single-process step."""
    spec, workload = point.model, point.workload
    g = Geometry(micro_batch=workload.batch, seq=workload.seq, act_bytes=bytes_per_element(workload.precision),
                 flash_attention=point.fused_attention)
    layer, extra = layer_ops(spec, g), embedding_ops(spec, g) + head_ops(spec, g)
    out = {"forward": [(op.kind, op.forward, float(spec.n_layers)) for op in layer]
           + [(op.kind, op.forward, 1.0) for op in extra],
           "backward": [(op.kind, op.backward, float(spec.n_layers)) for op in layer]
           + [(op.kind, op.backward, 1.0) for op in extra]}
    if "optimizer" in point.phases:
        from stepscope.perfmodel.evaluate import param_tensors

        params = spec.param_count()
        grad = bytes_per_element(workload.precision)
        out["optimizer"] = [("vector", Cost(flops=OPTIMIZER_FLOPS_PER_PARAM * params,
                                            bytes=params * optimizer_bytes_per_param(workload.precision, grad),
                                            kernels=param_tensors(spec, spec.n_layers, True, True)), 1.0)]
    return out


def _weights(size_flops: float, knots: Sequence[float]) -> np.ndarray:
    """Harmonic-interpolation weights of one op size on the knots (1/η = Σ w_k / η_k), clamped."""
    x = math.log10(max(size_flops, 1.0) / 1e9)
    xs = [math.log10(k) for k in knots]
    w = np.zeros(len(knots))
    if x <= xs[0]:
        w[0] = 1.0
    elif x >= xs[-1]:
        w[-1] = 1.0
    else:
        i = next(i for i in range(1, len(xs)) if x <= xs[i])
        frac = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        w[i - 1], w[i] = 1 - frac, frac
    return w


class _Model:
    """Parameters θ = [1/η at each knot, 1/vector rate, 1/bandwidth, overhead] and the phase design rows."""

    def __init__(self, knots: Sequence[float], peaks: dict[str, float], flash_efficiency: float) -> None:
        self.knots, self.peaks, self.flash = list(knots), peaks, flash_efficiency
        self.k = len(knots)

    def _compute(self, kind: str, cost: Cost, precision: str, theta: np.ndarray):
        """(compute seconds under θ, its coefficients: on the curve columns, or on the vector column)."""
        if kind == "vector":
            return cost.flops * theta[self.k], None
        w = _weights(cost.flops / max(cost.kernels, 1), self.knots)
        factor = self.flash if kind == "attention" else 1.0
        coef = cost.flops / (self.peaks[precision] * factor) * w
        return float(coef @ theta[:self.k]), coef

    def row(self, terms, precision: str, theta: np.ndarray,
            vector_threshold: float) -> tuple[np.ndarray, tuple[bool, ...]]:
        """Design row of one phase, and which ops are compute-bound: matrix ops by θ (the larger side),
        elementwise ops by their FLOP/byte ratio against `vector_threshold` (= bandwidth / vector rate)."""
        k = self.k
        row = np.zeros(k + 3)
        sides = []
        for kind, cost, count in terms:
            row[k + 2] += count * cost.kernels
            compute, coef = self._compute(kind, cost, precision, theta)
            if kind == "vector":
                compute_bound = cost.flops > vector_threshold * cost.bytes
            else:
                compute_bound = compute >= cost.bytes * theta[k + 1]
            sides.append(compute_bound)
            if not compute_bound:
                row[k + 1] += count * cost.bytes
            elif coef is None:
                row[k] += count * cost.flops
            else:
                row[:k] += count * coef
        return row, tuple(sides)

    def predict(self, terms, precision: str, theta: np.ndarray) -> float:
        """Phase seconds under θ with the real roofline: max(compute, memory) + overhead per op."""
        total = 0.0
        for kind, cost, count in terms:
            compute, _ = self._compute(kind, cost, precision, theta)
            total += count * (max(compute, cost.bytes * theta[self.k + 1]) + cost.kernels * theta[self.k + 2])
        return total


def _fit(model: _Model, rows: list, y: np.ndarray, theta: np.ndarray, floor: float,
         prior: np.ndarray | None, prior_weight: float) -> tuple[np.ndarray, int]:
    """Least squares on relative errors, θ ≥ 0, 1/η non-increasing and ≥ floor. Elementwise ops are split
    into memory- and compute-bound at every possible FLOP/byte threshold (the max() makes the problem
    piecewise linear); for each split, matrix ops are re-assigned until stable. The split whose fitted
    parameters best explain the measurements with the real max() model wins."""
    k = model.k
    cumulative = np.triu(np.ones((k, k)))  # 1/η = floor + cumulative @ d, d ≥ 0
    ratios = sorted({cost.flops / cost.bytes for terms, _ in rows for kind, cost, _ in terms
                     if kind == "vector" and cost.bytes > 0})
    thresholds = [0.0] + [(a + b) / 2 for a, b in zip(ratios, ratios[1:])] + [float("inf")]
    best: tuple[float, np.ndarray, int] | None = None
    for threshold in thresholds:
        current, previous = theta, None
        for iteration in range(1, 21):
            built = [model.row(terms, precision, current, threshold) for terms, precision in rows]
            design = np.array([row for row, _ in built])
            curve = design[:, :k]
            a = np.hstack([curve @ cumulative, design[:, k:]]) / y[:, None]
            b = (y - curve.sum(axis=1) * floor) / y
            if prior is not None and prior_weight > 0:  # rows w·x/x_base = w: weak pull toward the base
                # a base value of 0 (e.g. a fitted kernel overhead of 0 in a calibrated base) has no scale
                anchored = np.nonzero(prior > 0)[0]
                pull = np.zeros((len(anchored), a.shape[1]))
                pull[np.arange(len(anchored)), k + anchored] = prior_weight / prior[anchored]
                a, b = np.vstack([a, pull]), np.concatenate([b, np.full(len(anchored), prior_weight)])
            solution = nnls(a, b)
            current = np.concatenate([floor + cumulative @ solution[:k], solution[k:]])
            signature = tuple(sides for _, sides in built)
            if signature == previous:
                break
            previous = signature
        predicted = np.array([model.predict(terms, precision, current) for terms, precision in rows])
        error = float(np.sum(((predicted - y) / y) ** 2))
        if best is None or error < best[0]:
            best = (error, current, iteration)
    assert best is not None
    return best[1], best[2]


def calibrate(records: RecordSet, base: SystemSpec, *, knots: Sequence[float] = DEFAULT_KNOTS_GFLOP,
              max_efficiency: float = 1.25, prior_weight: float = PRIOR_WEIGHT,
              name: str = "calibrated") -> Calibration:
    """Fit `base`'s accelerator (and network, from comm records) to the measured records."""
    notes: list[str] = []
    points = _one_host(records.steps, notes)
    if not points:
        raise UsageError("no usable step records to calibrate from (run `stepscope step` first)")
    acc = base.accelerator
    peaks = dict((p, acc.matrix_peak(p)) for p in acc.matrix_TFLOPps)
    measured_peaks: dict[str, list[float]] = {}
    for point in points:
        if point.gemm_flops_per_s:
            measured_peaks.setdefault(point.workload.precision, []).append(point.gemm_flops_per_s)
    peaks.update({p: median(v) for p, v in measured_peaks.items()})
    for point in points:
        if point.workload.precision not in peaks:
            raise UsageError(f"no matrix peak for {point.workload.precision}: the records lack gemm_GFLOPps and "
                             f"the base system {base.name} has no {point.workload.precision} entry")
    rows, targets = [], []
    for point in points:
        for phase, terms in _terms(point).items():
            rows.append((terms, point.workload.precision))
            targets.append(point.phases[phase])
    y = np.array(targets)
    floor = 1.0 / max_efficiency  # 1/η never below this, i.e. η never above max_efficiency
    theta = np.concatenate([[1.0 / acc.efficiency(g * 1e9) for g in knots],
                            [1.0 / acc.vector_peak(points[0].workload.precision), 1.0 / acc.memory_bytes_per_s,
                             acc.kernel_overhead_us * 1e-6]])
    model = _Model(knots, peaks, acc.flash_efficiency)
    k = len(knots)
    prior = theta[k:].copy()
    theta, iterations = _fit(model, rows, y, theta, floor, prior, prior_weight)
    fitted = _accelerator(acc, peaks, knots, theta, acc.flash_efficiency, notes=None)
    # fused-attention efficiency from attention records, against the fitted curve and overhead; then refit
    flash = _flash_efficiency(records.attention, fitted, notes)
    if flash != acc.flash_efficiency:
        model.flash = flash
        theta, iterations = _fit(model, rows, y, theta, floor, prior, prior_weight)
    fitted = _accelerator(acc, peaks, knots, theta, flash, notes)
    for name_, fitted_value, base_value in zip(("elementwise rate", "bandwidth", "kernel overhead"), theta[k:], prior):
        if fitted_value > 0 and base_value > 0 and abs(fitted_value / base_value - 1) < 1e-3:
            notes.append(f"the records do not constrain the {name_}: it stays at the base system's value")
    inverse, x_vector, x_bytes, x_kernel = theta[:k], theta[k], theta[k + 1], theta[k + 2]
    network = _network(records.comm, base, notes)
    hosts = sorted({p.host for p in points})
    system = SystemSpec(name=name, accelerator=fitted, network=network,
                        description=f"fitted by stepscope calibrate to {len(points)} step configurations on "
                                    f"{', '.join(hosts)} ({len(y)} phases)")
    parameters = {**{f"efficiency_at_{g:g}_GFLOP": 1.0 / inv for g, inv in zip(knots, inverse)},
                  "vector_GFLOPps": 1.0 / x_vector / 1e9 if x_vector > 0 else float("nan"),
                  "bandwidth_GBps": 1.0 / x_bytes / 1e9 if x_bytes > 0 else float("nan"),
                  "kernel_overhead_us": x_kernel * 1e6, "flash_efficiency": flash,
                  **{f"matrix_peak_{p}_GFLOPps": v / 1e9 for p, v in sorted(peaks.items()) if p in measured_peaks}}
    return Calibration(system=system, points=points, parameters=parameters, iterations=iterations, notes=notes)


def _accelerator(acc: Accelerator, peaks: dict[str, float], knots: Sequence[float], theta: np.ndarray,
                 flash: float, notes: list[str] | None) -> Accelerator:
    """The base accelerator with the fitted parameters (unidentified ones kept from the base)."""
    k = len(knots)
    inverse, x_vector, x_bytes, x_kernel = theta[:k], theta[k], theta[k + 1], theta[k + 2]
    if notes is not None and x_vector <= 0:
        notes.append("no phase was limited by elementwise compute: the vector rate is kept from the base system")
    if notes is not None and x_bytes <= 0:
        notes.append("no phase was limited by memory bandwidth: the bandwidth is kept from the base system")
    vector_tflops = {p: (1.0 / x_vector / 1e12 if x_vector > 0 else acc.vector_TFLOPps.get(p, 1.0))
                     for p in sorted(set(acc.vector_TFLOPps) | set(peaks))}
    return replace(acc, name=f"{acc.name} (calibrated)", matrix_TFLOPps={p: v / 1e12 for p, v in peaks.items()},
                   vector_TFLOPps=vector_tflops,
                   hbm_GBps=(1.0 / x_bytes / 1e9) if x_bytes > 0 else acc.hbm_GBps * acc.memory_efficiency,
                   memory_efficiency=1.0,
                   matrix_efficiency_by_GFLOP=tuple((g, float(1.0 / inv)) for g, inv in zip(knots, inverse)),
                   kernel_overhead_us=float(x_kernel * 1e6), flash_efficiency=flash)


def _one_host(points: list[StepPoint], notes: list[str]) -> list[StepPoint]:
    """Keep the (host, threads) group with the most records: different machines are different systems."""
    if not points:
        return []
    groups = Counter((p.host, p.threads) for p in points)
    (host, threads), _ = groups.most_common(1)[0]
    if len(groups) > 1:
        notes.append(f"records from {len(groups)} (host, threads) groups: using {host} with {threads} threads "
                     f"({groups[(host, threads)]} configurations); filter with --where to choose")
    return [p for p in points if (p.host, p.threads) == (host, threads)]


def _flash_efficiency(points: list[AttentionPoint], acc: Accelerator, notes: list[str]) -> float:
    """Median over fused-kernel records of (curve compute time) / (measured time − launch overhead)."""
    fused = [p for p in points if p.backend != "naive" and p.precision in acc.matrix_TFLOPps]
    ratios = []
    for p in fused:
        spec = ModelSpec(vocab_size=1, context_length=p.seq, d_model=p.heads * p.head_dim, n_layers=1,
                         n_heads=p.heads, d_ff=1, positions="learned")
        g = Geometry(micro_batch=p.batch, seq=p.seq, act_bytes=bytes_per_element(p.precision), flash_attention=True)
        op = attention_ops(spec, g)[0]
        square = 1.0 if p.causal else 2.0  # the op is causal; without a mask the kernel does the full square
        for cost, measured in ((op.forward, p.forward_s), (op.backward, p.backward_s)):
            busy = (measured or 0.0) - cost.kernels * acc.kernel_overhead_us * 1e-6
            if busy > 0:
                flops = square * cost.flops
                ideal = flops / (acc.matrix_peak(p.precision) * acc.efficiency(flops / max(cost.kernels, 1)))
                ratios.append(ideal / busy)
    if not ratios:
        return acc.flash_efficiency
    notes.append(f"flash_efficiency from {len(fused)} fused attention records")
    return float(median(ratios))


def _network(points: list[CommPoint], base: SystemSpec, notes: list[str]):
    if not points:
        return base.network
    backends = Counter(p.backend for p in points)
    backend = backends.most_common(1)[0][0]
    latencies, rates = [], []
    for p in points:
        n = p.world_size
        if p.backend != backend or n < 2:
            continue
        if p.op in ("all_reduce", "all-reduce"):
            steps, factor = 2 * (n - 1), 2 * (n - 1) / n
        elif p.op in ("reduce_scatter", "reduce-scatter", "all_gather", "all-gather"):
            steps, factor = n - 1, (n - 1) / n
        else:
            continue
        # t = alpha + bus_factor·S/beta  ==  steps·α_hop + factor·S/B   =>   B = beta·factor/bus_factor
        latencies.append(p.alpha_us / steps)
        rates.append(p.beta_GBps * factor / p.bus_factor)
    if not rates:
        notes.append("comm records had no ring collective with 2+ ranks: the network is kept from the base system")
        return base.network
    notes.append(f"intra-domain link from {len(rates)} {backend} comm fits")
    tier = NetworkTier(name=f"{backend} (calibrated)", GBps=float(median(rates)), latency_us=float(median(latencies)),
                       efficiency=1.0)
    return replace(base.network, intra=tier)
