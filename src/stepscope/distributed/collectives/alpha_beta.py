"""The α–β model of a collective, fitted to measured (size, time) points by least squares.

    t(S) = alpha + factor * S / beta

- `alpha_us`: the fixed cost of one call in microseconds (latency, software overhead, all hops);
- `beta_GBps`: the asymptotic bandwidth in GB/s (1e9 bytes). With `factor` = the op's busbw factor it
  is a bus bandwidth, comparable across ops and to link rates (a ring all-reduce has
  t = 2(n-1)·α_hop + 2(n-1)/n · S/B, so beta ≈ B and alpha ≈ 2(n-1)·α_hop); with factor 1 it is the
  algorithm bandwidth S/t at large S.

The fit minimizes squared *relative* residuals, (model - t) / t: sizes span many decades and an
ordinary fit would let the largest sizes decide alone, leaving alpha meaningless. alpha and beta are
kept non-negative (a negative intercept from noise is refitted with alpha = 0; a time that does not
grow with size gives beta = None: no bandwidth term was measurable).

Records: the comm benchmark stores each fit as a record of kind `comm` whose config has
`"record": "fit"` (measured points have `"record": "point"`) plus backend, op, world_size, dtype,
mode, in_place (redop when not sum, source for imports, skew and seed for all_to_allv) and the size
range; metrics `alpha_us`, `beta_GBps`, `residual_rms_pct`, `residual_max_pct`, `residual_rms_us`,
`points`, `bus_factor`. A group with fewer than MIN_FIT_SIZES sizes gets a note instead of a fit.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.distributed.collectives.ops import OPS, busbw_factor
from stepscope.results.store import make_record

FIT_GROUP_FIELDS = ("backend", "op", "world_size", "dtype", "mode", "in_place")
OPTIONAL_GROUP_FIELDS = ("redop", "source", "skew", "seed")
"""Also grouped on, and written to the fit's config, only when a point has them."""
MIN_FIT_SIZES = 3
"""Distinct sizes a stored fit needs: two parameters through two points always fit exactly (residual 0),
so a noisy point would become an absurd alpha or beta with nothing showing it."""


@dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted t(S) = alpha + factor * S / beta, and how well it matches the points."""

    alpha_us: float
    beta_GBps: float | None
    """None when no bandwidth term was measurable (time did not grow with size)."""
    bus_factor: float
    residual_rms_pct: float
    """Root-mean-square of (model - measured) / measured, in percent."""
    residual_max_pct: float
    residual_rms_us: float
    points: int

    def predict_us(self, size_bytes: float) -> float:
        """Modelled time of one call moving S = `size_bytes`."""
        if self.beta_GBps is None:
            return self.alpha_us
        return self.alpha_us + self.bus_factor * size_bytes / (self.beta_GBps * 1e3)  # GB/s = 1e3 bytes/us

    def metrics(self) -> dict[str, Any]:
        return {"alpha_us": self.alpha_us, "beta_GBps": self.beta_GBps, "residual_rms_pct": self.residual_rms_pct,
                "residual_max_pct": self.residual_max_pct, "residual_rms_us": self.residual_rms_us,
                "points": self.points, "bus_factor": self.bus_factor}


def fit_alpha_beta(sizes_bytes: Sequence[float], times_us: Sequence[float], bus_factor: float = 1.0) -> AlphaBetaFit:
    """Least-squares α–β fit of `times_us` (one call) against `sizes_bytes` (S); needs two distinct sizes."""
    size = np.asarray(sizes_bytes, dtype=np.float64)
    time = np.asarray(times_us, dtype=np.float64)
    if size.shape != time.shape or size.ndim != 1:
        raise ValueError("sizes_bytes and times_us must be 1-D and of equal length")
    if np.any(time <= 0) or np.any(size < 0):
        raise ValueError("times must be positive and sizes non-negative")
    if len(np.unique(size)) < 2:
        raise ValueError("an α–β fit needs at least two distinct sizes")
    if bus_factor <= 0:
        raise ValueError("bus_factor must be positive")
    x = bus_factor * size  # bytes that cross the bus per call
    weight = 1.0 / time  # relative residuals: each point counts by its error in percent
    design = np.stack([weight, x * weight], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(design, np.ones_like(time), rcond=None)  # slope: us per byte
    if alpha < 0:
        alpha = 0.0
        slope = float(np.sum(x * weight) / np.sum((x * weight) ** 2))
    if slope * x.max() <= 1e-9 * time.max():  # no bandwidth term above rounding noise
        slope = 0.0
        alpha = float(np.sum(weight) / np.sum(weight ** 2))  # the relative-LS constant
    model = alpha + slope * x
    relative = (model - time) / time
    return AlphaBetaFit(alpha_us=float(alpha), beta_GBps=float(1.0 / slope / 1e3) if slope > 0 else None,
                        bus_factor=bus_factor, residual_rms_pct=float(100 * math.sqrt(np.mean(relative ** 2))),
                        residual_max_pct=float(100 * np.max(np.abs(relative))),
                        residual_rms_us=float(math.sqrt(np.mean((model - time) ** 2))), points=len(time))


def headline_time_us(metrics: dict[str, Any]) -> float | None:
    """The time a comm point is judged by: the max over ranks when measured, else the logged mean."""
    value = metrics.get("time_us_max")
    return metrics.get("time_us_mean") if value is None else value


def fit_records(records: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One fit record per (backend, op, world_size, dtype, mode, in_place[, redop, source]) group of
    measured points with at least MIN_FIT_SIZES sizes, plus notes for the groups that cannot be fitted."""
    groups: OrderedDict[tuple, list[dict[str, Any]]] = OrderedDict()
    for record in records:
        config = record.get("config", {})
        if record.get("kind") != "comm" or config.get("record") != "point" or record.get("status") != "ok":
            continue
        if config.get("op") == "barrier" or not config.get("size_bytes"):
            continue
        if headline_time_us(record.get("metrics", {})) is None:
            continue
        # imports stay apart, and so do reductions other than sum (imported nccl-tests `-o prod` logs) and
        # all_to_allv's skews (a different split is a different collective for the model)
        key = tuple(config.get(f) for f in FIT_GROUP_FIELDS) + tuple(config.get(f) for f in OPTIONAL_GROUP_FIELDS)
        groups.setdefault(key, []).append(record)
    fits, notes = [], []
    width = len(FIT_GROUP_FIELDS)
    for key, members in groups.items():
        group = dict(zip(FIT_GROUP_FIELDS, key[:width], strict=True))
        for name, value in zip(OPTIONAL_GROUP_FIELDS, key[width:], strict=True):
            if value is not None:
                group[name] = value
        label = " ".join(str(group[f]) for f in ("backend", "op", "dtype", "mode")) + \
            (f" {group['redop']}" if "redop" in group else "") + \
            (f" skew {group['skew']:g}" if "skew" in group else "") + \
            f" on {group['world_size']} ranks{' in-place' if group['in_place'] else ''}"
        # an op stepscope does not know (an imported log of another nccl-tests program): algorithm bandwidth
        factor = busbw_factor(group["op"], int(group["world_size"])) if group["op"] in OPS else 1.0
        sizes = [m["config"]["size_bytes"] for m in members]
        if not factor:
            notes.append(f"no α–β fit for {label}: a single rank moves nothing over the bus")
            continue
        if len(set(sizes)) < MIN_FIT_SIZES:
            notes.append(f"no α–β fit for {label}: needs at least {MIN_FIT_SIZES} sizes, has {len(set(sizes))} "
                         "(two parameters through two points fit exactly: no residual to judge them)")
            continue
        fit = fit_alpha_beta(sizes, [headline_time_us(m["metrics"]) for m in members], factor)
        config = {"record": "fit", "model": "alpha_beta", **group, "size_min_bytes": min(sizes),
                  "size_max_bytes": max(sizes)}
        fits.append(make_record("comm", config, fit.metrics(), env=members[-1].get("env", {})))
    return fits, notes
