"""`calibrate --trace`: a system fitted to the `trace` records of a user's own run (`stepscope trace --out`).

From the shapes alone (`roofline` records, traces recorded with `record_shapes=True`), against `base`'s peaks:
- the efficiency curve: at each knot of `base`'s curve, 1/η = Σ w·t / Σ w·(f / peak) over the matmul-family rows
  (t their kernel time, f their FLOPs, w the harmonic interpolation weight of their GFLOP per kernel on that knot,
  the curve's own rule); a knot no row is nearer to than to its neighbours keeps `base`'s shape, scaled as the
  nearest fitted knot is;
- `flash_efficiency` = Σ f / Σ t·peak·η(f per kernel) over the attention rows (fused attention's fraction of the
  curve);
- the streaming bandwidth: Σ bytes / Σ t over the elementwise, normalisation and softmax rows, as
  `memory_efficiency` of `base`'s `hbm_GBps` (capped at 1);
- the links: per collective kind, t = a + b·S fitted to the NCCL kernels' mean time per message size
  (`collective_size` records), read as a ring of n ranks: latency α = a / steps, bandwidth = factor / b (all_reduce:
  2(n−1) steps, factor 2(n−1)/n; all_gather, reduce_scatter: n−1, (n−1)/n); the kind with the most time sets
  the tier its group fits in (intra when n <= domain size).
With the traced run's model, workload and plan, the model then reproduces the trace's per-category times
(`trace_categories`): each category's inverse rate is scaled by measured / predicted — matrix (the curve, so its
shape stays) for matmul, flash for attention, the vector rate for vector, the links for communication, the
bandwidth for the optimizer (it streams weights, gradients and moments) — repeated until the predictions stop
moving. Overhead is not scaled: the kernel overhead is measured (the GPU's mean gap before a queued kernel, per
model kernel), and the rest of the GPU's idle time is the host's (`trace_categories`: max(kernel overhead, host's
issue time − the GPU's work)), read from the trace. The vector category is fitted by the vector rate, not the
bandwidth, which the GEMMs share: the model's elementwise ops then run at the rate that gives the trace's
elementwise time (a real step runs more elementwise kernels than the model counts: casts, rotary embeddings,
masks). Where that rate makes the model's optimizer compute-bound, the bandwidth no longer moves it and its error
stays (the table shows it).
What the records cannot fit keeps `base`'s value, and every parameter says where its value comes from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.fit import interpolation_weights
from stepscope.perfmodel.calibrate.trace_categories import (
    measured_categories,
    model_kernels,
    predicted_categories,
    scaled,
)
from stepscope.perfmodel.model.ops import activation_precision
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import NetworkTier, SystemSpec

ROUNDS = 8
RING = {"all_reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n), "all_gather": lambda n: (n - 1, (n - 1) / n),
        "reduce_scatter": lambda n: (n - 1, (n - 1) / n)}
CATEGORIES = ("matmul", "attention", "vector", "optimizer", "overhead", "communication")
KERNEL_GAP = "kernel gap"


def fitted_by(precision: str, system: SystemSpec) -> dict[str, str]:
    """The inverse rate each category is fitted by (see the module docstring); overhead by none: the kernel
    overhead is measured, the rest of it is the host's."""
    rates = system.accelerator.vector_TFLOPps
    apart = precision != "fp32" and "fp32" in rates and precision in rates
    return {"matmul": "matrix", "attention": "flash", "vector": f"vector:{precision}" if apart else "vector",
            "optimizer": "bytes", "overhead": KERNEL_GAP, "communication": "network"}


@dataclass
class TraceFit:
    """The fitted system and, per parameter, its value and where it comes from."""

    system: SystemSpec
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    categories: list[dict[str, Any]] = field(default_factory=list)
    """Per category: measured, predicted by the base and by the fitted system (ms), with the model only."""

    def add(self, parameter: str, base: Any, fitted: Any, source: str) -> None:
        self.rows.append({"parameter": parameter, "base": base, "fitted": fitted, "source": source})


def fit_shapes(records: list[dict[str, Any]], base: SystemSpec, fit: TraceFit) -> SystemSpec:
    """`base` with what the roofline and collective-size records determine (see the module docstring)."""
    acc = base.accelerator
    rows = [r for r in records if r["config"].get("record") == "roofline"]
    if not rows:
        fit.notes.append("no roofline records (the trace has no shapes: record with record_shapes=True): the "
                         "efficiency curve, flash_efficiency and memory_efficiency are not fitted from shapes")
    gemm = [r for r in rows if r["config"].get("family") == "gemm" and r["config"]["precision"] in acc.matrix_TFLOPps]
    knots = [g for g, _ in acc.matrix_efficiency_by_GFLOP]
    curve = list(acc.matrix_efficiency_by_GFLOP)
    if gemm:
        time = np.zeros(len(knots))
        ideal = np.zeros(len(knots))
        weight = np.zeros(len(knots))
        for r in gemm:
            m = r["metrics"]
            w = interpolation_weights(1e9 * m["GFLOP"] / max(m["kernels"], 1), knots)  # per kernel
            time += w * m["time_ms"] / 1e3
            ideal += w * m["GFLOP"] * 1e9 / acc.matrix_peak(r["config"]["precision"])
            weight = np.maximum(weight, w)
        fitted = [i for i in range(len(knots)) if weight[i] >= 0.5]
        if not fitted:  # every op between two knots: the nearer one
            fitted = [int(np.argmax(weight))]
        for i in range(len(knots)):
            nearest = min(fitted, key=lambda j: abs(j - i))
            ratio = ideal[nearest] / time[nearest] / acc.matrix_efficiency_by_GFLOP[nearest][1]
            curve[i] = (knots[i], float(ideal[i] / time[i]) if i in fitted else curve[i][1] * ratio)
        acc = dataclasses.replace(acc, matrix_efficiency_by_GFLOP=tuple(curve))
        fit.add("efficiency curve", _knots(base.accelerator.matrix_efficiency_by_GFLOP), _knots(curve),
                f"{len(gemm)} matmul (op, shape) rows; knots at {', '.join(f'{knots[i]:g}' for i in fitted)} GFLOP "
                "fitted, the others keep the base's shape")
    attention = [r for r in rows if r["config"].get("family") == "attention"
                 and r["config"]["precision"] in acc.matrix_TFLOPps]
    if attention:
        flops = sum(r["metrics"]["GFLOP"] * 1e9 for r in attention)
        curve_time = sum(r["metrics"]["time_ms"] / 1e3 * acc.matrix_peak(r["config"]["precision"])
                         * acc.efficiency(r["metrics"]["GFLOP"] * 1e9 / max(r["metrics"]["kernels"], 1))
                         for r in attention)
        acc = dataclasses.replace(acc, flash_efficiency=flops / curve_time)
        fit.add("flash_efficiency", base.accelerator.flash_efficiency, acc.flash_efficiency,
                f"{len(attention)} attention rows, FLOP-weighted against the fitted curve")
    streaming = [r for r in rows if r["config"].get("family") in ("elementwise", "normalization", "softmax")]
    if streaming:
        rate = (sum(r["metrics"]["bytes"] / 1e9 for r in streaming)
                / sum(r["metrics"]["time_ms"] / 1e3 for r in streaming))
        acc = dataclasses.replace(acc, memory_efficiency=min(1.0, rate / acc.hbm_GBps))
        fit.add("memory_efficiency", base.accelerator.memory_efficiency, acc.memory_efficiency,
                f"{rate:.0f} GB/s over {len(streaming)} elementwise/normalization/softmax rows, of hbm_GBps "
                f"{acc.hbm_GBps:g}" + (" (capped at 1)" if rate > acc.hbm_GBps else ""))
    network = _links(records, base, fit)
    return dataclasses.replace(base, accelerator=acc, network=network)


def _knots(curve: Any) -> str:
    return " ".join(f"{g:g}:{eta:.3f}" for g, eta in curve)


def _links(records: list[dict[str, Any]], base: SystemSpec, fit: TraceFit):
    """α/β per collective kind from the NCCL kernels' sizes; the kind with the most time sets its tier."""
    sizes = [r for r in records if r["config"].get("record") == "collective_size"]
    if not sizes:
        fit.notes.append("no collective sizes in the trace (NCCL kernels without `In msg nelems`, or none): the "
                         "links keep the base's α and bandwidth")
        return base.network
    network, best = base.network, 0.0
    kinds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in sizes:
        kinds.setdefault((r["config"]["collective"], int(r["config"]["group_size"])), []).append(r)
    for (kind, n), points in sorted(kinds.items()):
        sizes_b = np.array([p["config"]["bytes"] for p in points], float)
        times = np.array([p["metrics"]["mean_us"] * 1e-6 for p in points])
        if kind not in RING or n < 2 or len(set(sizes_b)) < 2:
            fit.notes.append(f"{kind} over {n} ranks: {len(set(sizes_b))} message size(s), not a ring collective "
                             "with two sizes or more: no α/β")
            continue
        b, a = np.polyfit(sizes_b, times, 1)
        if b <= 0:
            continue
        steps, factor = RING[kind](n)
        latency, gbps = max(a, 0.0) / steps * 1e6, factor / b / 1e9
        total = float(sum(p["metrics"]["total_us"] for p in points))
        fit.add(f"{kind} over {n} ranks", None, f"α {latency:.2f} µs/step, {gbps:.1f} GB/s",
                f"t = a + b·S over {len(points)} sizes ({total / 1e3:.1f} ms)")
        if total > best:
            best = total
            where = "intra" if n <= base.network.domain_size else "inter"
            tier = NetworkTier(name=f"fitted to {kind} kernels", GBps=gbps, latency_us=latency, efficiency=1.0)
            network = dataclasses.replace(base.network, **{where: tier})
    return network


def fit_model(records: list[dict[str, Any]], spec: ModelSpec, workload: Workload, plan: ParallelPlan,
              system: SystemSpec, fit: TraceFit) -> SystemSpec:
    """Scale each category's inverse rate until the model's categories match the trace's (median over ranks); the
    kernel overhead from the GPU's gap before a queued kernel; overhead then follows from the host's time."""
    measured_by_rank = measured_categories(records)
    if not measured_by_rank:
        raise UsageError("no trace step records to fit the model to (a trace without ProfilerStep ranges)")
    first = next(iter(measured_by_rank.values()))
    measured = {c: median(m[c] for m in measured_by_rank.values() if c in m) for c in first}
    host = measured.get("host")
    start = predicted_categories(spec, workload, plan, system, host)
    system = _kernel_overhead(measured, spec, workload, plan, system, fit)
    by = fitted_by(activation_precision(workload.precision), system)
    for _ in range(ROUNDS):
        predicted = predicted_categories(spec, workload, plan, system)
        for category, rate in by.items():
            if rate != KERNEL_GAP and measured[category] > 0 and predicted[category] > 0:
                system = scaled(system, rate, measured[category] / predicted[category])
    final = predicted_categories(spec, workload, plan, system, host)
    for category in CATEGORIES:
        if measured[category] == 0 and final[category] > 0:
            fit.notes.append(f"{category}: the trace has none, the model predicts {1e3 * final[category]:.3f} ms "
                             "(not fitted)")
    work = sum(final[c] for c in CATEGORIES if c != "overhead")
    if host is not None and host - work > final["overhead"] - 1e-12 and host > work:
        fit.notes.append(f"host-bound: the host takes {1e3 * host:.1f} ms to issue a step of {measured['kernels']:.0f} "
                         f"kernels ({1e6 * host / max(measured['kernels'], 1):.1f} µs each) and the GPU's work "
                         f"{1e3 * work:.1f} ms, so the GPU idles the difference; predict and plan price the GPU's work "
                         "(no host), so a plan that keeps this host is at least the host's time per step")
    fit.categories = [{"category": c, "measured_ms": 1e3 * measured[c], "base_ms": 1e3 * start[c],
                       "fitted_ms": 1e3 * final[c],
                       "fitted_error_pct": 100 * (final[c] - measured[c]) / measured[c] if measured[c] else None,
                       "fitted_by": by[c]} for c in CATEGORIES]
    return _normalised(system)


def _kernel_overhead(measured: dict[str, float], spec: ModelSpec, workload: Workload, plan: ParallelPlan,
                     system: SystemSpec, fit: TraceFit) -> SystemSpec:
    """The kernel overhead: the GPU's mean gap before a queued kernel times the trace's kernels per model kernel
    (the model prices fewer, larger kernels than a real step runs: casts, copies, fused pieces apart)."""
    if "gap" not in measured:
        fit.notes.append("no kernel waited in the queue (or no launch calls): the kernel overhead keeps the base's "
                         f"{system.accelerator.kernel_overhead_us:g} µs")
        return system
    kernels = model_kernels(spec, workload, plan, system)
    overhead = 1e6 * measured["gap"] * measured["kernels"] / kernels
    fit.add("kernel_overhead_us", system.accelerator.kernel_overhead_us, overhead,
            f"GPU gap {1e6 * measured['gap']:.2f} µs before a queued kernel x {measured['kernels']:.0f} trace kernels "
            f"per {kernels:.0f} model kernels")
    return dataclasses.replace(system, accelerator=dataclasses.replace(system.accelerator,
                                                                      kernel_overhead_us=overhead))


def _normalised(system: SystemSpec) -> SystemSpec:
    """Efficiencies above 1 moved into the rates: the curve's top and memory_efficiency at most 1 (the same
    times: a peak and an efficiency only appear as their product)."""
    acc = system.accelerator
    top = max(eta for _, eta in acc.matrix_efficiency_by_GFLOP)
    if top > 1:
        acc = dataclasses.replace(acc, matrix_TFLOPps={p: v * top for p, v in acc.matrix_TFLOPps.items()},
                                  matrix_efficiency_by_GFLOP=tuple((g, e / top)
                                                                   for g, e in acc.matrix_efficiency_by_GFLOP))
    if acc.memory_efficiency > 1:
        acc = dataclasses.replace(acc, hbm_GBps=acc.hbm_GBps * acc.memory_efficiency, memory_efficiency=1.0)
    if acc.flash_efficiency <= 0 or not math.isfinite(acc.flash_efficiency):
        raise UsageError("the fit gave no finite flash efficiency")
    return dataclasses.replace(system, accelerator=acc)
