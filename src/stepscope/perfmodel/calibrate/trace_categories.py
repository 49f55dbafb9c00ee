"""A step's time by category, measured (the `trace` records of `stepscope trace`) and predicted (the performance
model), in the same six categories, so a trace can calibrate the model and be compared with it:

    matmul, attention, vector (elementwise, normalisation, softmax, reductions, copies), optimizer,
    communication (exposed), overhead (GPU idle: launch and host gaps)

Measured: the median over a rank's steps of each category's kernel time (`category` records; `vector` sums the
categories not named here), the exposed communication and the idle time of its `step` records; and of the host's
time to issue a step (`host_ms`), its kernels and the GPU's gap before a queued kernel (`launch_gap_us`).

Overhead is GPU idle, and it has two causes. The GPU's own cost per kernel (a gap of about 2 µs before each kernel,
seen where kernels wait in the queue): the model's kernel overhead, paid once per kernel. And the host: the GPU
cannot run a kernel before the host has issued it, so a step lasts at least the host's issue time H, whatever the
GPU does meanwhile; when the GPU's work W (the other five categories) is shorter, it idles H − W in all. So

    overhead = max(kernels × kernel overhead, H − W)

(the kernel gaps then fall inside the host's time). H is the host's, not the model's: it is read from the trace the
prediction is put next to (`host_s`), as the batch and the plan are. Without it, overhead is the kernel overhead
alone (a GPU-bound run).

Predicted, through the public model only (`evaluate`): a step's time is a sum over ops of max(compute, memory) +
overhead, plus exposed collectives, and every term is proportional to one inverse rate (1/matrix peak, 1/flash
efficiency, 1/vector peak, 1/bandwidth, the kernel overhead, 1/link bandwidth and latency). Such a time is
homogeneous of degree 1 in those inverse rates, so by Euler's theorem it is the sum of x·∂T/∂x over them: the time
each rate accounts for. `attributed` measures x·∂T/∂x per breakdown cause by a relative step of `STEP` on each
(exact where no op changes sides of its max() within the step). matmul = the matrix peak's share less the flash
efficiency's (attention runs at peak·η·flash), vector = the vector rate's and bandwidth's shares of forward,
backward and recompute, optimizer = those of the optimizer, overhead = the kernel overhead's everywhere,
communication = the exposed collective causes (and the pipeline bubble).
"""

from __future__ import annotations

import dataclasses
from statistics import median
from typing import Any

from stepscope.perfmodel.model.evaluate import COMM_CAUSES, evaluate
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import NetworkTier, SystemSpec

CATEGORIES = ("matmul", "attention", "vector", "optimizer", "communication", "overhead")
MEASURED_AS_THEMSELVES = ("matmul", "attention", "optimizer")
"""Trace categories kept as they are; every other kernel category but communication is `vector`."""
STEP = 1e-4
PASSES = ("forward_compute", "backward_compute", "recompute")
RATES = ("matrix", "flash", "vector", "bytes", "overhead", "network")


def scaled(system: SystemSpec, rate: str, factor: float) -> SystemSpec:
    """`system` with the inverse rate `rate` multiplied by `factor` (the rate divided by it)."""
    acc, net = system.accelerator, system.network
    if rate == "matrix":  # the efficiency curve (a peak and an efficiency only appear as their product)
        acc = dataclasses.replace(acc, matrix_efficiency_by_GFLOP=tuple((g, e / factor)
                                                                        for g, e in acc.matrix_efficiency_by_GFLOP))
    elif rate == "flash":
        acc = dataclasses.replace(acc, flash_efficiency=acc.flash_efficiency / factor)
    elif rate.startswith("vector"):  # `vector`: every precision's rate; `vector:bf16`: that precision's only
        only = rate.partition(":")[2]
        acc = dataclasses.replace(acc, vector_TFLOPps={p: v / factor if only in ("", p) else v
                                                       for p, v in acc.vector_TFLOPps.items()})
    elif rate == "bytes":
        acc = dataclasses.replace(acc, hbm_GBps=acc.hbm_GBps / factor)
    elif rate == "overhead":
        acc = dataclasses.replace(acc, kernel_overhead_us=acc.kernel_overhead_us * factor)
    elif rate == "network":
        def tier(t: NetworkTier) -> NetworkTier:
            return dataclasses.replace(t, GBps=t.GBps / factor, latency_us=t.latency_us * factor)

        net = dataclasses.replace(net, intra=tier(net.intra), inter=tier(net.inter))
    else:
        raise ValueError(rate)
    return dataclasses.replace(system, accelerator=acc, network=net)


def attributed(spec: ModelSpec, workload: Workload, plan: ParallelPlan,
               system: SystemSpec) -> dict[str, dict[str, float]]:
    """rate -> breakdown cause -> seconds that rate accounts for (x·∂T/∂x), and `total` -> cause -> seconds."""
    base = evaluate(spec, workload, plan, system).breakdown
    out = {"total": dict(base)}
    for rate in RATES:
        moved = evaluate(spec, workload, plan, scaled(system, rate, 1 + STEP)).breakdown
        out[rate] = {cause: (moved[cause] - base[cause]) / STEP for cause in base}
    return out


def predicted_categories(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec,
                         host_s: float | None = None) -> dict[str, float]:
    """Seconds per category of one predicted step (see the module docstring); they add up to the step. `host_s`: the
    host's time to issue a step, measured (None: not known, no host-bound idle)."""
    shares = attributed(spec, workload, plan, system)

    def over(rate: str, causes: tuple[str, ...]) -> float:
        return sum(shares[rate].get(c, 0.0) for c in causes)

    compute = (*PASSES, "optimizer")
    total = shares["total"]
    out = {"matmul": over("matrix", PASSES) - over("flash", PASSES), "attention": over("flash", PASSES),
           "vector": over("vector", PASSES) + over("bytes", PASSES),
           "optimizer": over("vector", ("optimizer",)) + over("bytes", ("optimizer",)),
           "communication": sum(total.get(c, 0.0) for c in (*COMM_CAUSES, "bubble")),
           "overhead": over("overhead", compute)}
    if host_s is not None:  # the GPU waits for the host (see the module docstring)
        work = sum(seconds for category, seconds in out.items() if category != "overhead")
        out["overhead"] = max(out["overhead"], host_s - work)
    return out


def model_kernels(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec) -> float:
    """Kernels the model launches per step (its kernel overhead's share of the step over the overhead per kernel)."""
    shares = attributed(spec, workload, plan, system)
    seconds = sum(shares["overhead"].get(c, 0.0) for c in (*PASSES, "optimizer"))
    return seconds / (system.accelerator.kernel_overhead_us * 1e-6)


def measured_categories(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """rank -> seconds per category, the median over the rank's steps (`step` and `category` records of one job;
    the rank totals, step `all`, are left out)."""
    steps: dict[tuple[int, Any], dict[str, float]] = {}
    for record in records:
        config, metrics = record["config"], record["metrics"]
        if config.get("step") == "all":
            continue
        key = (int(config.get("rank") or 0), config.get("step"))
        row = steps.setdefault(key, dict.fromkeys(CATEGORIES, 0.0))
        if config.get("record") == "step":
            row["communication"] = float(metrics.get("comm_exposed_ms") or 0.0) / 1e3
            row["overhead"] = float(metrics.get("idle_ms") or 0.0) / 1e3
            row["step"] = float(metrics.get("step_ms") or 0.0) / 1e3
            row["kernels"] = float(metrics.get("kernels") or 0.0)
            for key, name, scale in (("host_ms", "host", 1e-3), ("launch_gap_us", "gap", 1e-6)):
                if metrics.get(key) is not None:
                    row[name] = float(metrics[key]) * scale
        elif config.get("record") == "category":
            category = config.get("category")
            if category == "communication":
                continue
            name = category if category in MEASURED_AS_THEMSELVES else "vector"
            row[name] += float(metrics.get("time_ms") or 0.0) / 1e3
    by_rank: dict[int, list[dict[str, float]]] = {}
    for (rank, _), row in steps.items():
        if "step" in row:
            by_rank.setdefault(rank, []).append(row)
    out = {}
    for rank, rows in sorted(by_rank.items()):
        out[rank] = {c: median(r[c] for r in rows) for c in (*CATEGORIES, "step", "kernels")}
        for optional in ("host", "gap"):  # traces without launch calls, or with no kernel queued, have none
            values = [r[optional] for r in rows if optional in r]
            if values:
                out[rank][optional] = median(values)
    return out


def category_rows(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec,
                  records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank and category: measured (median over the rank's steps) and predicted ms per step (given the rank's
    measured host time), and the error."""
    rows = []
    for rank, measured in measured_categories(records).items():
        predicted = predicted_categories(spec, workload, plan, system, measured.get("host"))
        for category in CATEGORIES:
            m, p = 1e3 * measured[category], 1e3 * predicted[category]
            rows.append({"rank": rank, "category": category, "measured_ms": m, "predicted_ms": p,
                         "error_pct": 100 * (p - m) / m if m > 0 else None})
    return rows
