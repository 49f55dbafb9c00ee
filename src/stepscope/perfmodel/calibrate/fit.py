"""The least-squares core of `calibrate`: the linear phase model, which parameters the records identify,
and the bounded fit.

Parameters θ = [1/η at each curve knot, 1/vector rate, 1/bandwidth, kernel overhead]. A phase's time is
linear in θ once every op is assigned to its compute or memory side, so the fit is non-negative least
squares on relative errors (`nnls`), repeated over the possible assignments (see `fit`).

Physical bounds, all enforced by the parameterization rather than checked afterwards:
- η ≤ `max_efficiency` at every knot and η never decreases with op size: 1/η = floor + (sums of d ≥ 0);
- a knot no op of the records is near is not a parameter: it is tied to the constrained knots (flat
  beyond the outermost ones, interpolated between two of them), see `constrained_knots` and `tie_matrix`;
- the rates and the overhead are ≥ 0; the caller fixes any the fit drives to 0 (see `calibrate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from stepscope.perfmodel.calibrate.nnls import nnls
from stepscope.perfmodel.model.op_types import Cost

SCALARS = ("vector", "bytes", "kernel")
"""The parameters after the curve knots, in θ order: 1/vector FLOP/s, 1/bytes/s, seconds per kernel."""

Terms = list[tuple[str, Cost, float]]
"""(kind, cost, count) of every op of one phase."""


def interpolation_weights(size_flops: float, knots: Sequence[float]) -> np.ndarray:
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


def op_size(cost: Cost) -> float:
    """FLOPs per kernel: the size the efficiency curve is read at."""
    return cost.flops / max(cost.kernels, 1)


def constrained_knots(rows: Sequence[tuple[Terms, str]], knots: Sequence[float]) -> list[int]:
    """Indices of the knots the records identify: at least one matrix or attention op lies nearer to the
    knot than to its neighbours on the log-size axis (it puts at least half its interpolation weight on
    it). Farther knots are set only by extrapolating the records' ops, which they do not determine."""
    nearest = np.zeros(len(knots))
    for terms, _ in rows:
        for kind, cost, count in terms:
            if kind != "vector" and cost.flops > 0 and count > 0:
                nearest = np.maximum(nearest, interpolation_weights(op_size(cost), knots))
    return [i for i, w in enumerate(nearest) if w >= 0.5]


def tie_matrix(knots: Sequence[float], free: Sequence[int]) -> np.ndarray:
    """T (knots x free): 1/η = floor + T·d with d ≥ 0. Constrained knot f_i gets floor + Σ_{j≥i} d_j
    (non-increasing with size, never below floor); a knot below (above) every constrained one takes the
    smallest (largest) constrained knot's value: flat, no size trend the records do not show; a knot
    between two constrained ones takes their harmonic interpolation, which the curve would give anyway."""
    r = len(free)
    cumulative = np.triu(np.ones((r, r)))
    xs = [math.log10(g) for g in knots]
    tie = np.zeros((len(knots), r))
    for i in range(len(knots)):
        if i <= free[0]:
            tie[i] = cumulative[0]
        elif i >= free[-1]:
            tie[i] = cumulative[-1]
        else:
            a = max(j for j in range(r) if free[j] <= i)
            if free[a] == i:
                tie[i] = cumulative[a]
            else:
                t = (xs[i] - xs[free[a]]) / (xs[free[a + 1]] - xs[free[a]])
                tie[i] = (1 - t) * cumulative[a] + t * cumulative[a + 1]
    return tie


class PhaseModel:
    """The design rows of the measured phases under θ (see the module docstring)."""

    def __init__(self, knots: Sequence[float], peaks: dict[str, float], flash_efficiency: float) -> None:
        self.knots, self.peaks, self.flash = list(knots), peaks, flash_efficiency
        self.k = len(knots)

    def _compute(self, kind: str, cost: Cost, precision: str, theta: np.ndarray):
        """(compute seconds under θ, its coefficients: on the curve columns, or on the vector column)."""
        if kind == "vector":
            return cost.flops * theta[self.k], None
        w = interpolation_weights(op_size(cost), self.knots)
        factor = self.flash if kind == "attention" else 1.0
        coef = cost.flops / (self.peaks[precision] * factor) * w
        return float(coef @ theta[:self.k]), coef

    def row(self, terms: Terms, precision: str, theta: np.ndarray,
            vector_threshold: float) -> tuple[np.ndarray, tuple[bool, ...]]:
        """Design row of one phase, and which ops are compute-bound: matrix ops by θ (the larger side),
        elementwise ops by their FLOP/byte ratio against `vector_threshold` (= bandwidth / vector rate)."""
        k = self.k
        row = np.zeros(k + 3)
        sides = []
        for kind, cost, count in terms:
            row[k + 2] += count * cost.kernels
            compute, coef = self._compute(kind, cost, precision, theta)
            if kind == "vector":  # an op that moves no bytes is bound by its FLOPs (inf x 0 would be nan)
                compute_bound = cost.flops > vector_threshold * cost.bytes if cost.bytes else cost.flops > 0
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

    def predict(self, terms: Terms, precision: str, theta: np.ndarray) -> float:
        """Phase seconds under θ with the real roofline: max(compute, memory) + overhead per op."""
        total = 0.0
        for kind, cost, count in terms:
            compute, _ = self._compute(kind, cost, precision, theta)
            total += count * (max(compute, cost.bytes * theta[self.k + 1]) + cost.kernels * theta[self.k + 2])
        return total


def fit(model: PhaseModel, rows: list[tuple[Terms, str]], y: np.ndarray, theta: np.ndarray, floor: float,
        tie: np.ndarray, fixed: dict[int, float], prior: np.ndarray, prior_weight: float) -> tuple[np.ndarray, int]:
    """Least squares on relative errors with the curve 1/η = floor + tie·d (d ≥ 0), the scalars ≥ 0 and those
    in `fixed` (index into SCALARS -> value) held at their value. Elementwise ops are split into memory-
    and compute-bound at every possible FLOP/byte threshold (the max() makes the problem piecewise linear);
    for each split, matrix ops are re-assigned until stable. The split whose fitted parameters best explain
    the measurements with the real max() model wins. `prior` (base values of the scalars) adds rows
    prior_weight·x/x_base = prior_weight: a weak pull toward the base for what the records barely see."""
    k = model.k
    free = [j for j in range(len(SCALARS)) if j not in fixed]
    ratios = sorted({cost.flops / cost.bytes for terms, _ in rows for kind, cost, _ in terms
                     if kind == "vector" and cost.bytes > 0})
    thresholds = [0.0] + [(a + b) / 2 for a, b in pairwise(ratios)] + [float("inf")]
    start = theta.copy()
    for j, value in fixed.items():
        start[k + j] = value
    best: tuple[float, np.ndarray, int] | None = None
    for threshold in thresholds:
        current, previous = start, None
        for iteration in range(1, 21):  # noqa: B007 - read after the loop: the rounds it took
            built = [model.row(terms, precision, current, threshold) for terms, precision in rows]
            design = np.array([row for row, _ in built])
            curve = design[:, :k]
            known = curve.sum(axis=1) * floor + sum(design[:, k + j] * v for j, v in fixed.items())
            a = np.hstack([curve @ tie, design[:, [k + j for j in free]]]) / y[:, None]
            b = (y - known) / y
            # a base value of 0 (e.g. a fitted kernel overhead of 0 in a calibrated base) has no scale
            anchored = [(column, j) for column, j in enumerate(free) if prior[j] > 0]
            if anchored and prior_weight > 0:
                pull = np.zeros((len(anchored), a.shape[1]))
                for r, (column, j) in enumerate(anchored):
                    pull[r, tie.shape[1] + column] = prior_weight / prior[j]
                a, b = np.vstack([a, pull]), np.concatenate([b, np.full(len(anchored), prior_weight)])
            solution = nnls(a, b)
            scalars = start[k:].copy()
            scalars[free] = solution[tie.shape[1]:]
            current = np.concatenate([floor + tie @ solution[:tie.shape[1]], scalars])
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
