"""Fit a system to stepscope's own measurements and return it as a SystemSpec (written out as TOML).

From step records (forward / backward / optimizer medians of single-process steps):
- the matrix peak per precision is the host's measured large-GEMM rate (`gemm_TFLOPps` in the records);
- the efficiency curve (1/η at each knot, non-increasing with op size, η ≤ `max_efficiency`, default
  `MAX_EFFICIENCY` = 1: no op runs faster than the measured large-GEMM rate), the per-kernel overhead, the
  streaming bandwidth and the elementwise rate are fitted together by non-negative least squares on the
  relative error of every measured phase, with a weak pull of the last three toward the base system
  (`PRIOR_WEIGHT`). Each op's time is max(compute, memory) + overhead (see `calibrate_fit`).
- What the records do not identify is not fitted, and every parameter says where it comes from
  (`Calibration.sources`): a knot no op is near is tied to the constrained knots (flat beyond the outermost,
  interpolated between two); a rate or the overhead the fit drives to 0 (an infinite rate, or an overhead
  the records cannot resolve) is kept from the base system and the rest is fitted again with it held there.
From attention records (when present): `flash_efficiency` = median of the curve's time for a fused
attention kernel over the measured time. From comm records (when present): the intra-domain link's α and
bandwidth, converting each α–β fit of a ring collective over n ranks to per-step latency and link rate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import median

import numpy as np

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.fit import SCALARS, PhaseModel, Terms, constrained_knots, fit, tie_matrix
from stepscope.perfmodel.model.op_types import Cost, Geometry
from stepscope.perfmodel.model.ops import attention_ops, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.model.ops_moe import moe_layer_ops
from stepscope.perfmodel.model.rates import efficiency
from stepscope.perfmodel.model.schedule import OPTIMIZER_FLOPS_PER_PARAM, optimizer_bytes_per_param
from stepscope.perfmodel.model.tensors import param_tensors
from stepscope.perfmodel.records import AttentionPoint, CommPoint, RecordSet, StepPoint
from stepscope.spec import ModelSpec, bytes_per_element
from stepscope.spec.system import Accelerator, NetworkTier, SystemSpec

DEFAULT_KNOTS_GFLOP = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
# Weight of the pull toward the base system's elementwise rate, bandwidth and kernel overhead, in units of
# one phase's relative error: records that barely constrain these (e.g. all phases GEMM-bound) leave them
# near the base instead of at an unphysical extreme; records that do constrain them win.
PRIOR_WEIGHT = 0.01
# The efficiency is a fraction of the measured large-GEMM rate, the best case of the same host, so it is
# capped there. When the peak measurement itself ran slow, the fit sits at the cap (the output says so) and
# the rest shows as fit error; --max-efficiency allows a margin, up to MAX_EFFICIENCY_LIMIT.
MAX_EFFICIENCY = 1.0
MAX_EFFICIENCY_LIMIT = 1.1
SCALAR_NAMES = {"vector": "vector_TFLOPps", "bytes": "bandwidth_GBps", "kernel": "kernel_overhead_us"}


@dataclass(frozen=True)
class Calibration:
    """The fitted system and how well it explains the records it was fitted on."""

    system: SystemSpec
    points: list[StepPoint]
    parameters: dict[str, float]
    """Every parameter's value in the fitted system (kept and tied ones included)."""
    sources: dict[str, str]
    """Where each parameter's value comes from: `fitted`, `measured ...`, `not constrained: ...`."""
    iterations: int
    notes: list[str] = field(default_factory=list)

    @property
    def unconstrained(self) -> list[str]:
        """The parameters the records did not determine (tied or kept from the base system)."""
        return [name for name, source in self.sources.items() if source.startswith("not constrained")]


def _terms(point: StepPoint) -> dict[str, Terms]:
    """(kind, cost, count) of every op of each measured phase of a single-process step."""
    spec, workload = point.model, point.workload
    g = Geometry(micro_batch=workload.batch, seq=workload.seq, act_bytes=bytes_per_element(workload.precision),
                 flash_attention=point.fused_attention)
    # the same blocks the prediction counts: dense ones, then (Mixture-of-Experts models) the MoE ones
    dense_ops, moe_ops = layer_ops(spec, g), (moe_layer_ops(spec, g) if spec.is_moe else [])
    blocks = [(op, float(spec.n_layers - spec.moe_layers)) for op in dense_ops]
    blocks += [(op, float(spec.moe_layers)) for op in moe_ops]
    extra = embedding_ops(spec, g) + head_ops(spec, g)
    out = {"forward": [(op.kind, op.forward, n) for op, n in blocks] + [(op.kind, op.forward, 1.0) for op in extra],
           "backward": [(op.kind, op.backward, n) for op, n in blocks]
           + [(op.kind, op.backward, 1.0) for op in extra]}
    if "optimizer" in point.phases:
        params = spec.param_count()
        grad = bytes_per_element(workload.precision)
        out["optimizer"] = [("vector", Cost(flops=OPTIMIZER_FLOPS_PER_PARAM * params,
                                            bytes=params * optimizer_bytes_per_param(workload.precision, grad),
                                            kernels=param_tensors(spec, spec.n_layers - spec.moe_layers, True, True,
                                                                     spec.moe_layers)), 1.0)]
    return out


def check_max_efficiency(value: float) -> None:
    """Raise a UsageError unless 0 < value <= MAX_EFFICIENCY_LIMIT."""
    if not 0 < value <= MAX_EFFICIENCY_LIMIT:
        raise UsageError(f"--max-efficiency must be in (0, {MAX_EFFICIENCY_LIMIT:g}], got {value:g}: "
                         f"it is a fraction of the measured large-GEMM rate")


def calibrate(records: RecordSet, base: SystemSpec, *, knots: Sequence[float] = DEFAULT_KNOTS_GFLOP,
              max_efficiency: float = MAX_EFFICIENCY, prior_weight: float = PRIOR_WEIGHT,
              name: str = "calibrated") -> Calibration:
    """Fit `base`'s accelerator (and network, from comm records) to the measured records."""
    check_max_efficiency(max_efficiency)
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
            raise UsageError(f"no matrix peak for {point.workload.precision}: the records lack gemm_TFLOPps and "
                             f"the base system {base.name} has no {point.workload.precision} entry")
    rows: list[tuple[Terms, str]] = []
    targets = []
    for point in points:
        for phase, terms in _terms(point).items():
            if phase not in point.phases:  # a forward-only step measures no backward
                continue
            rows.append((terms, point.workload.precision))
            targets.append(point.phases[phase])
    y = np.array(targets)
    floor = 1.0 / max_efficiency  # 1/η never below this, i.e. η never above max_efficiency
    theta = np.concatenate([[1.0 / efficiency(acc, g * 1e9) for g in knots],
                            [1.0 / acc.vector_peak(points[0].workload.precision), 1.0 / acc.memory_bytes_per_s,
                             acc.kernel_overhead_us * 1e-6]])
    model = PhaseModel(knots, peaks, acc.flash_efficiency)
    k = len(knots)
    prior = theta[k:].copy()
    free_knots = constrained_knots(rows, knots)
    tie = tie_matrix(knots, free_knots)
    theta, iterations, fixed = _fit_physical(model, rows, y, theta, floor, tie, prior, prior_weight)
    fitted = _accelerator(acc, peaks, knots, theta, acc.flash_efficiency)
    # fused-attention efficiency from attention records, against the fitted curve and overhead; then refit
    flash = _flash_efficiency(records.attention, fitted, notes)
    if flash != acc.flash_efficiency:
        model.flash = flash
        theta, iterations, fixed = _fit_physical(model, rows, y, theta, floor, tie, prior, prior_weight)
    fitted = _accelerator(acc, peaks, knots, theta, flash)
    network = _network(records.comm, base, notes)
    hosts = sorted({p.host for p in points})
    system = SystemSpec(name=name, accelerator=fitted, network=network,
                        description=f"fitted by stepscope calibrate to {len(points)} step configurations on "
                                    f"{', '.join(hosts)} ({len(y)} phases)")
    inverse, x_vector, x_bytes, x_kernel = theta[:k], theta[k], theta[k + 1], theta[k + 2]
    parameters = {**{f"efficiency_at_{g:g}_GFLOP": float(1.0 / inv) for g, inv in zip(knots, inverse, strict=True)},
                  "vector_TFLOPps": float(1.0 / x_vector / 1e12), "bandwidth_GBps": float(1.0 / x_bytes / 1e9),
                  "kernel_overhead_us": float(x_kernel * 1e6), "flash_efficiency": flash,
                  **{f"matrix_peak_{p}_TFLOPps": v / 1e12 for p, v in sorted(peaks.items()) if p in measured_peaks}}
    sources = _sources(knots, free_knots, theta, floor, fixed, prior, base.name, flash != acc.flash_efficiency,
                       measured_peaks)
    notes.extend(_identification_notes(sources, knots, free_knots, len(y), max_efficiency))
    return Calibration(system=system, points=points, parameters=parameters, sources=sources,
                       iterations=iterations, notes=notes)


def _fit_physical(model: PhaseModel, rows: list[tuple[Terms, str]], y: np.ndarray, theta: np.ndarray,
                  floor: float, tie: np.ndarray, prior: np.ndarray,
                  prior_weight: float) -> tuple[np.ndarray, int, dict[int, float]]:
    """`fit`, then hold at the base value every rate or overhead the fit drove to 0 and fit the rest again.
    A 1/rate of 0 is an infinite rate; an overhead of 0 is the records saying it is too small to resolve.
    Either way the records did not determine it, and the other parameters must be fitted with the value
    the written system will actually carry (else the curve absorbs time that the system then adds back)."""
    fixed: dict[int, float] = {}
    while True:
        theta, iterations = fit(model, rows, y, theta, floor, tie, fixed, prior, prior_weight)
        driven_to_zero = {j: float(prior[j]) for j in range(len(SCALARS))
                          if j not in fixed and theta[model.k + j] <= 0 and prior[j] > 0}
        if not driven_to_zero:
            return theta, iterations, fixed
        fixed.update(driven_to_zero)


def _sources(knots: Sequence[float], free: list[int], theta: np.ndarray, floor: float, fixed: dict[int, float],
             prior: np.ndarray, base: str, flash_fitted: bool,
             measured_peaks: dict[str, list[float]]) -> dict[str, str]:
    """parameter -> where its value comes from (see `Calibration.sources`)."""
    k = len(knots)
    out: dict[str, str] = {}
    for i, g in enumerate(knots):
        key = f"efficiency_at_{g:g}_GFLOP"
        if i in free:
            out[key] = "fitted, at the cap" if theta[i] <= floor * (1 + 1e-9) else "fitted"
        elif i < free[0]:
            out[key] = f"not constrained: flat from {knots[free[0]]:g} GFLOP (no op this small)"
        elif i > free[-1]:
            out[key] = f"not constrained: flat from {knots[free[-1]]:g} GFLOP (no op this large)"
        else:
            out[key] = "not constrained: interpolated (no op near it)"
    for j, scalar in enumerate(SCALARS):
        key = SCALAR_NAMES[scalar]
        value = theta[k + j]
        if j in fixed:
            out[key] = f"not constrained: kept from {base} (the fit drove it to 0)"
        elif prior[j] > 0 and value > 0 and abs(value / prior[j] - 1) < 1e-3:
            out[key] = f"not constrained: stays at {base}'s value"
        else:
            out[key] = "fitted"
    out["flash_efficiency"] = ("fitted to attention records" if flash_fitted
                               else f"not constrained: kept from {base} (no attention records)")
    for p in sorted(measured_peaks):
        out[f"matrix_peak_{p}_TFLOPps"] = "measured (gemm_TFLOPps)"
    return out


def _identification_notes(sources: dict[str, str], knots: Sequence[float], free: list[int], phases: int,
                          max_efficiency: float) -> list[str]:
    """Say what the records did not determine, and whether the fit is underdetermined."""
    notes = []
    unconstrained = [name for name, source in sources.items() if source.startswith("not constrained")]
    nominal = len(knots) + len(SCALARS)
    free_count = len(free) + sum(1 for s in SCALARS if sources[SCALAR_NAMES[s]] == "fitted")
    if unconstrained:
        notes.append(f"not constrained by these records (tied or kept, see source): {', '.join(unconstrained)}")
    if phases < nominal:
        notes.append(f"underdetermined: {phases} measured phases for {nominal} parameters (curve knots, vector rate, "
                     f"bandwidth, kernel overhead); {free_count} fitted, the rest tied or kept (see source)"
                     + ("; still more than the phases: the fitted values are one physical explanation of the "
                        "records (monotone curve, capped, pulled toward the base), not the only one"
                        if free_count > phases else ""))
    capped = [f"{knots[i]:g}" for i in free if sources[f"efficiency_at_{knots[i]:g}_GFLOP"] == "fitted, at the cap"]
    if capped:
        notes.append(f"the efficiency at {', '.join(capped)} GFLOP sits at the cap {max_efficiency:g} (the measured "
                     f"GEMM peak): "
                     + ("one of many equally good fits of too few phases" if free_count > phases else
                        "the records ask for more, as when the peak measurement ran slow "
                        "(--max-efficiency allows a margin)"))
    return notes


def _accelerator(acc: Accelerator, peaks: dict[str, float], knots: Sequence[float], theta: np.ndarray,
                 flash: float) -> Accelerator:
    """The base accelerator with the fitted parameters (θ carries the kept values of unidentified ones)."""
    k = len(knots)
    inverse, x_vector, x_bytes, x_kernel = theta[:k], theta[k], theta[k + 1], theta[k + 2]
    vector_tflops = {p: 1.0 / x_vector / 1e12 for p in sorted(set(acc.vector_TFLOPps) | set(peaks))}
    return replace(acc, name=f"{acc.name} (calibrated)", matrix_TFLOPps={p: v / 1e12 for p, v in peaks.items()},
                   vector_TFLOPps=vector_tflops, hbm_GBps=1.0 / x_bytes / 1e9, memory_efficiency=1.0,
                   matrix_efficiency_by_GFLOP=tuple((g, float(1.0 / inv))
                                                    for g, inv in zip(knots, inverse, strict=True)),
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
                ideal = flops / (acc.matrix_peak(p.precision) * efficiency(acc, flops / max(cost.kernels, 1)))
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
