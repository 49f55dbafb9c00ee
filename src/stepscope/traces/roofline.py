"""Per-op roofline of one rank's trace: for every op whose shapes were recorded and that has a cost rule
(`traces/opcost.py`), the GPU time of the kernels it launched, its achieved TFLOP/s and GB/s, and the fraction of
the device's peak (`traces/peaks.py`), grouped by (op, shape, precision); a total line per family (`gemm` is the
matmul family's).

A kernel belongs to the innermost costed op that was running on the CPU thread of its launch call when the call
started (the launch is matched by correlation id): `aten::linear` -> `aten::addmm` -> kernel counts the kernel once,
under `aten::addmm`. A CPU trace (stepscope's own `profile --trace`) has no kernels: an op's time is its own CPU
time, and only ops with no costed op inside them count (the innermost ones), so nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.traces.kinds import hta_type
from stepscope.traces.opcost import OpCost
from stepscope.traces.peaks import DevicePeaks, gemm_precision
from stepscope.traces.read import RankTrace

FAMILIES = ("gemm", "attention", "normalization", "softmax", "elementwise")
"""The op families, in the order tables list them."""


@dataclass(frozen=True)
class RooflineRow:
    """One (op, shape, precision) of one rank: its calls, kernels, time, FLOPs and bytes."""

    op: str
    cost: OpCost
    precision: str
    """The precision the peak is read for (`tf32` for fp32 GEMMs on TF32 tensor cores)."""
    calls: int
    kernels: int
    time_us: float
    flops: float
    bytes: float

    def metrics(self, peaks: DevicePeaks) -> dict[str, Any]:
        return rates(self.flops, self.bytes, self.time_us, self.precision, self.cost.family, peaks) | {
            "calls": self.calls, "kernels": self.kernels, "GFLOP_per_call": self.flops / self.calls / 1e9}


def rates(flops: float, moved: float, time_us: float, precision: str, family: str,
          peaks: DevicePeaks) -> dict[str, Any]:
    """Achieved TFLOP/s and GB/s of `flops` and `moved` bytes in `time_us`, their fraction of the peaks, and which
    roof bounds an op of that intensity (`compute` when its FLOP/byte is above the ridge peak / bandwidth)."""
    seconds = time_us / 1e6
    tflops = flops / seconds / 1e12 if seconds > 0 else None
    gbps = moved / seconds / 1e9 if seconds > 0 else None
    peak = peaks.matrix_peak(precision) if family in ("gemm", "attention") else None
    out: dict[str, Any] = {"time_ms": time_us / 1e3, "GFLOP": flops / 1e9, "bytes": moved,
                           "TFLOPps": tflops, "GBps": gbps,
                           "intensity_FLOP_per_byte": flops / moved if moved > 0 else None,
                           "peak_pct": 100 * tflops * 1e12 / peak if peak and tflops is not None else None,
                           "bandwidth_pct": (100 * gbps * 1e9 / peaks.bandwidth
                                             if peaks.bandwidth and gbps is not None else None)}
    if peak and peaks.bandwidth and moved > 0:
        out["bound"] = "compute" if flops / moved > peak / peaks.bandwidth else "memory"
    return out


def roofline(trace: RankTrace) -> list[RooflineRow]:
    """The rows of one rank (see the module docstring), by GPU time, largest first."""
    if not len(trace.op_key):
        return []
    parent = _innermost_parents(trace)
    if trace.device == "CPU":
        time, kernels = _cpu_times(trace, parent)
        kernel_names: list[list[str]] = [[] for _ in trace.op_keys]
    else:
        time, kernels, kernel_names = _kernel_times(trace, parent)
    rows = []
    calls = np.bincount(trace.op_key, weights=(kernels > 0), minlength=len(trace.op_keys))
    sums = np.bincount(trace.op_key, weights=time, minlength=len(trace.op_keys))
    counts = np.bincount(trace.op_key, weights=kernels, minlength=len(trace.op_keys))
    for key, cost in enumerate(trace.op_keys):
        if calls[key] == 0 or sums[key] <= 0:
            continue
        precision = gemm_precision(cost.precision, kernel_names[key]) if cost.family == "gemm" else cost.precision
        n = int(calls[key])
        rows.append(RooflineRow(trace.op_names[key], cost, precision, n, int(counts[key]), float(sums[key]),
                                cost.flops * n, cost.bytes * n))
    return sorted(rows, key=lambda row: -row.time_us)


def totals(rows: list[RooflineRow], peaks: DevicePeaks) -> list[dict[str, Any]]:
    """One line per family (and per precision within it): summed FLOPs and bytes over summed time."""
    groups: dict[tuple[str, str], list[RooflineRow]] = {}
    for row in rows:
        groups.setdefault((row.cost.family, row.precision), []).append(row)
    out = []
    for family in FAMILIES:
        for (fam, precision), members in sorted(groups.items()):
            if fam != family:
                continue
            time = sum(r.time_us for r in members)
            out.append({"family": family, "precision": precision, "calls": sum(r.calls for r in members),
                        "kernels": sum(r.kernels for r in members),
                        **rates(sum(r.flops for r in members), sum(r.bytes for r in members), time, precision,
                                family, peaks)})
    return out


def _innermost_parents(trace: RankTrace) -> np.ndarray:
    """For each costed op (in the trace's order), the index of the costed op that encloses it on its thread
    (-1: none), found with one stack per thread over the ops sorted by start (longer first at equal starts)."""
    order = np.lexsort((-trace.op_dur, trace.op_ts, trace.op_tid))
    parent = np.full(len(order), -1, np.int64)
    stack: list[int] = []
    thread = None
    ends = trace.op_ts + trace.op_dur
    for index in order.tolist():
        if trace.op_tid[index] != thread:
            thread, stack = trace.op_tid[index], []
        while stack and ends[stack[-1]] <= trace.op_ts[index]:
            stack.pop()
        parent[index] = stack[-1] if stack else -1
        stack.append(index)
    return parent


def _cpu_times(trace: RankTrace, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A CPU trace: each innermost costed op's own time, one 'kernel' each; an op enclosing another counts 0."""
    enclosing = np.zeros(len(parent), bool)
    enclosing[parent[parent >= 0]] = True
    inner = ~enclosing
    return np.where(inner, trace.op_dur, 0.0), inner.astype(np.float64)


def _kernel_times(trace: RankTrace, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """Per costed op: the summed duration and number of the GPU events it launched, and per key the names of its
    kernels (for the TF32 rule)."""
    time = np.zeros(len(trace.op_key))
    kernels = np.zeros(len(trace.op_key))
    names: list[set[str]] = [set() for _ in trace.op_keys]
    gpu, launch = _launched(trace)
    if not len(gpu):
        return time, kernels, [sorted(n) for n in names]
    owner = _owner(trace, parent, trace.launch_tid[launch], trace.launch_ts[launch])
    found = owner >= 0
    np.add.at(time, owner[found], trace.gpu_dur[gpu[found]])
    np.add.at(kernels, owner[found], 1.0)
    keys = trace.op_key[owner[found]]
    for key, name_id in set(zip(keys.tolist(), trace.gpu_name[gpu[found]].tolist(), strict=True)):
        names[key].add(trace.names[name_id])
    return time, kernels, [sorted(n) for n in names]


def _launched(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(GPU event index, runtime call index) of every GPU event launched by a call of the trace (syncs left out)."""
    if not len(trace.launch_corr) or not len(trace.gpu_corr):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    work = np.array([hta_type(n) != "other" for n in trace.names], bool)[trace.gpu_name]
    order = np.argsort(trace.launch_corr, kind="stable")
    sorted_corr = trace.launch_corr[order]
    at = np.minimum(np.searchsorted(sorted_corr, trace.gpu_corr), len(sorted_corr) - 1)
    found = (sorted_corr[at] == trace.gpu_corr) & (trace.gpu_corr >= 0) & work
    return np.flatnonzero(found), order[at[found]]


def _owner(trace: RankTrace, parent: np.ndarray, tids: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each (thread, time), the innermost costed op running there (-1: none): the latest op of that thread
    starting at or before the time, else its enclosing ops in turn, until one still runs."""
    owner = np.full(len(tids), -1, np.int64)
    ends = trace.op_ts + trace.op_dur
    for tid in sorted(set(tids.tolist())):
        ops = np.flatnonzero(trace.op_tid == tid)
        if not len(ops):
            continue
        ops = ops[np.lexsort((-trace.op_dur[ops], trace.op_ts[ops]))]
        mine = np.flatnonzero(tids == tid)
        at = np.searchsorted(trace.op_ts[ops], times[mine], "right") - 1
        candidate = np.where(at >= 0, ops[np.maximum(at, 0)], -1)
        for _ in range(64):  # climbs the nesting; ops nest a few levels deep
            out = (candidate >= 0) & (ends[np.maximum(candidate, 0)] < times[mine])
            if not out.any():
                break
            candidate = np.where(out, parent[np.maximum(candidate, 0)], candidate)
        owner[mine] = candidate
    return owner

