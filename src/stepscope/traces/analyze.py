"""One rank's trace analysed: the whole trace and each `ProfilerStep#N` broken down in time (idle / compute /
non-compute, HolisticTraceAnalysis's definitions), by category, by collective, with launch overhead and the top
kernels and CPU ops.

Definitions (HTA's, so the numbers agree with it):
- span: first GPU event start to last GPU event end; busy: the union of every GPU event (kernels, copies, memsets,
  syncs) on any stream; idle = span − busy;
- compute: the union of computation kernels (`traces.kinds.hta_type`); non-compute = busy − compute (memory,
  communication and sync time not under a computation kernel);
- communication overlap: the part of the communication kernels' union that a computation kernel also covers, as a
  share of that union; exposed communication = the rest.
The rank totals leave out the last step when there are two or more, as HTA does (`_counted`); their `step_ms` is
the mean window of the steps they count (the trace's span when it has no steps). A kernel belongs to
the step whose CPU range launched it (by correlation id; its own start when unmatched). A step's
GPU window runs from its first kernel to the first kernel of the next step (the last: to its last kernel's end), so
the steps tile the GPU timeline and the idle time between steps is counted in the step that waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.measure.categories import CATEGORIES
from stepscope.traces import intervals
from stepscope.traces.critical_path import critical_path
from stepscope.traces.kinds import HTA_TYPES, collective_kind, core_name, hta_type, kernel_category
from stepscope.traces.launches import host_issue_us, launches, queue_lengths, queued_gaps
from stepscope.traces.peaks import DevicePeaks, device_peaks
from stepscope.traces.read import RankTrace
from stepscope.traces.roofline import RooflineRow, roofline

COMPUTE, COMM = HTA_TYPES.index("computation"), HTA_TYPES.index("communication")


@dataclass(frozen=True)
class Breakdown:
    """Time of one GPU window (µs): HTA's temporal breakdown and communication overlap."""

    span_us: float
    busy_us: float
    compute_us: float
    comm_us: float
    comm_overlapped_us: float

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us

    @property
    def non_compute_us(self) -> float:
        return self.busy_us - self.compute_us

    @property
    def comm_exposed_us(self) -> float:
        return self.comm_us - self.comm_overlapped_us

    def pct(self, us: float) -> float:
        return 100 * us / self.span_us if self.span_us > 0 else 0.0

    @property
    def overlap_pct(self) -> float | None:
        """Share of communication hidden under computation (None: no communication)."""
        return 100 * self.comm_overlapped_us / self.comm_us if self.comm_us > 0 else None

    def metrics(self) -> dict[str, Any]:
        return {"gpu_span_ms": self.span_us / 1e3, "idle_ms": self.idle_us / 1e3, "compute_ms": self.compute_us / 1e3,
                "non_compute_ms": self.non_compute_us / 1e3, "idle_pct": self.pct(self.idle_us),
                "compute_pct": self.pct(self.compute_us), "non_compute_pct": self.pct(self.non_compute_us),
                "comm_ms": self.comm_us / 1e3, "comm_exposed_ms": self.comm_exposed_us / 1e3,
                "comm_overlap_pct": self.overlap_pct}


@dataclass
class Window:
    """One rank-step (or the whole trace): its breakdown, categories, collectives and launch overhead."""

    step: int | None
    breakdown: Breakdown
    categories: dict[str, float]
    """category -> summed kernel time (µs)."""
    collectives: dict[str, list[float]]
    """collective kind -> [calls, summed µs]."""
    kernels: int
    """Kernels (computation and communication; not copies, memsets or syncs, whose host call blocks by design)."""
    launch_bound: int
    """Kernels whose CPU launch took longer than the kernel ran."""
    queue_mean: float
    queue_max: int
    gap_us: float | None = None
    """Mean GPU gap before a queued kernel: from the end of the event before it on its stream to its start, over
    kernels whose launch call returned before that event ended (the GPU's own cost per kernel, seen only where work
    waits in the queue; None: no kernel was queued)."""
    cpu_step_us: float | None = None
    cpu_start_us: float = 0.0
    """When the step's CPU range began (0 for the whole trace)."""
    host_us: float | None = None
    """The host's time to issue the step (`launches.host_issue_us`)."""
    comm_durations: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Durations of this window's communication kernels in launch order (cross-rank wait)."""
    comm_kinds: tuple[str, ...] = ()
    """Their collective kinds, in the same order (the ranks' sequences must agree to be matched)."""
    step_us: float | None = None
    """The step time this window reports; None: its span. The rank totals report the mean of the counted steps'
    windows (a step, not the counted steps' span, which leaves out the idle time before the next step)."""

    def metrics(self, launch_bound_share: float) -> dict[str, Any]:
        total = sum(self.categories.values())
        step_us = self.breakdown.span_us if self.step_us is None else self.step_us
        out: dict[str, Any] = {"step_ms": step_us / 1e3,
                               "cpu_step_ms": None if self.cpu_step_us is None else self.cpu_step_us / 1e3,
                               "host_ms": None if self.host_us is None else self.host_us / 1e3}
        out.update(self.breakdown.metrics())
        out.update({f"{c.replace(' ', '_')}_pct": 100 * self.categories.get(c, 0.0) / total if total else 0.0
                    for c in CATEGORIES})
        out.update({"kernels": self.kernels, "launch_bound_kernels": self.launch_bound,
                    "launch_bound": bool(self.kernels and self.launch_bound / self.kernels > launch_bound_share),
                    "queue_mean": self.queue_mean, "queue_max": self.queue_max, "launch_gap_us": self.gap_us})
        return out


@dataclass
class RankAnalysis:
    """What one trace file says about its rank."""

    path: Path
    rank: int | None
    world_size: int | None
    device: str
    events: int
    total: Window
    steps: list[Window]
    top_kernels: list[dict[str, Any]]
    top_cpu_ops: list[dict[str, Any]]
    roofline: list[RooflineRow] = field(default_factory=list)
    """Per (op, shape, precision) with recorded shapes: time, FLOPs, bytes (`traces/roofline.py`)."""
    peaks: DevicePeaks | None = None
    shapes: bool = False
    """The trace was recorded with shapes."""
    collective_sizes: list[dict[str, Any]] = field(default_factory=list)
    """Per (collective kind, message bytes, group size): calls and time of the NCCL kernels that state their size."""
    critical_path: list[Any] = field(default_factory=list)
    """Per step: the critical path's length and its time per category (`traces/critical_path.py`)."""


def analyze(trace: RankTrace, top: int = 10, system: str | None = None) -> RankAnalysis:
    """The whole trace and each of its steps (see the module docstring), its roofline against the peaks of
    `system` (preset or TOML; None: found from the device's name) and its critical path per step."""
    ts, dur = trace.gpu_ts, trace.gpu_dur
    start, end = ts, ts + dur
    if trace.float_times:  # HTA rounds ns-resolution events inward to whole µs
        start, end = np.ceil(ts), np.floor(ts + dur)
        end = np.maximum(end, start)
    names = trace.names
    types = np.array([HTA_TYPES.index(hta_type(n)) for n in names], np.int64)[trace.gpu_name]
    category_of = [kernel_category(n) for n in names]
    cats = np.array([CATEGORIES.index(c) for c in category_of], np.int64)[trace.gpu_name]
    sets = _Sets(start, end, types)
    launch_ts, launch_dur = launches(trace)
    anchor = np.where(np.isnan(launch_ts), ts, launch_ts)
    queue = queue_lengths(anchor, end)
    context = _Context(trace, names, sets, dur, cats, launch_dur, queue, types, anchor,
                       queued_gaps(trace, start, end, launch_ts + launch_dur))

    counted = _counted(trace, launch_ts)
    if not counted.any():
        counted = np.ones(len(ts), bool)
    total_context = context if counted.all() else _Context(trace, names, _Sets(start[counted], end[counted],
                                                                                types[counted]), dur, cats,
                                                            launch_dur, queue, types, anchor, context.gaps)
    total = total_context.window(None, counted, float(start[counted].min()), float(end[counted].max()))
    steps = []
    if trace.steps:
        step_starts = np.array([s[1] for s in trace.steps])
        index = np.searchsorted(step_starts, anchor, "right") - 1
        inside = (index >= 0) & (anchor <= np.array([s[2] for s in trace.steps])[np.maximum(index, 0)])
        index = np.where(inside, index, -1)
        firsts = [float(start[index == k].min()) if np.any(index == k) else None for k in range(len(trace.steps))]
        for k, (number, cpu_start, cpu_end) in enumerate(trace.steps):
            mask = index == k
            if firsts[k] is None:
                continue
            # up to the earliest first kernel of any later step (a later step's copy can start on another stream
            # while this one's kernels are queued), never before its own first kernel
            later = [f for f in firsts[k + 1:] if f is not None]
            window_end = max(min(later), firsts[k]) if later else float(end[mask].max())
            window = context.window(number, mask, firsts[k], window_end)
            window.cpu_step_us, window.cpu_start_us = cpu_end - cpu_start, cpu_start
            window.host_us = host_issue_us(launch_ts + launch_dur, mask, cpu_start)
            steps.append(window)
    # the steps the totals count: those launched before the last step's mark when there are two or more
    last_mark = max(trace.step_marks.values()) if len(trace.step_marks) >= 2 else np.inf
    counted_steps = [w.breakdown.span_us for w in steps if w.cpu_start_us < last_mark]
    if counted_steps:
        total.step_us = float(np.mean(counted_steps))
    info = trace.distributed
    rank, world = info.get("rank"), info.get("world_size")
    return RankAnalysis(path=trace.path, rank=rank if isinstance(rank, int) else None,
                        world_size=world if isinstance(world, int) else None, device=trace.device_name,
                        events=trace.events, total=total, steps=steps,
                        top_kernels=_top_kernels(names, category_of, trace.gpu_name, dur, top),
                        top_cpu_ops=_top_cpu_ops(trace.cpu_ops, top), roofline=roofline(trace),
                        peaks=device_peaks(trace.device_name, system), shapes=trace.shapes,
                        critical_path=critical_path(trace, category_of, anchor,
                                                    [collective_kind(n) for n in names], types == COMM),
                        collective_sizes=_collective_sizes(trace))


@dataclass
class _Sets:
    """The merged GPU timelines, built once and clipped per window."""

    busy: tuple[np.ndarray, np.ndarray]
    compute: tuple[np.ndarray, np.ndarray]
    comm: tuple[np.ndarray, np.ndarray]

    def __init__(self, start: np.ndarray, end: np.ndarray, types: np.ndarray) -> None:
        self.busy = intervals.merge(start, end)
        self.compute = intervals.merge(start[types == COMPUTE], end[types == COMPUTE])
        self.comm = intervals.merge(start[types == COMM], end[types == COMM])

    def breakdown(self, first: float, last: float) -> Breakdown:
        comm, compute = intervals.clip(self.comm, first, last), intervals.clip(self.compute, first, last)
        return Breakdown(span_us=last - first, busy_us=intervals.length(intervals.clip(self.busy, first, last)),
                         compute_us=intervals.length(compute), comm_us=intervals.length(comm),
                         comm_overlapped_us=intervals.overlap(comm, compute))


@dataclass
class _Context:
    trace: RankTrace
    names: list[str]
    sets: _Sets
    dur: np.ndarray
    cats: np.ndarray
    launch_dur: np.ndarray
    queue: np.ndarray
    types: np.ndarray
    anchor: np.ndarray
    """When each event was launched (its CPU call's start; its own start when no call was found)."""
    gaps: np.ndarray
    """Each queued event's gap after the event before it on its stream (nan: not queued)."""

    def window(self, step: int | None, mask: np.ndarray, first: float, last: float) -> Window:
        dur, cats = self.dur[mask], self.cats[mask]
        sums = np.bincount(cats, weights=dur, minlength=len(CATEGORIES))
        categories = {c: float(sums[i]) for i, c in enumerate(CATEGORIES) if sums[i] > 0}
        comm = mask & (self.types == COMM)
        collectives: dict[str, list[float]] = {}
        for name_id, length in zip(self.trace.gpu_name[comm], self.dur[comm], strict=True):
            kind = collective_kind(self.names[name_id]) or "other"
            entry = collectives.setdefault(kind, [0, 0.0])
            entry[0] += 1
            entry[1] += float(length)
        kernel = (self.types[mask] == COMPUTE) | (self.types[mask] == COMM)
        launched = kernel & ~np.isnan(self.launch_dur[mask])
        bound = int(np.sum(self.launch_dur[mask][launched] > dur[launched]))
        queue = self.queue[mask]
        gaps = self.gaps[mask][kernel]
        gaps = gaps[~np.isnan(gaps)]
        # in launch order: a trace file lists events in buffer order, not the order they were issued
        comm_index = np.flatnonzero(comm)
        comm_index = comm_index[np.argsort(self.anchor[comm_index], kind="stable")]
        return Window(step=step, breakdown=self.sets.breakdown(first, last), categories=categories,
                      collectives=collectives, kernels=int(kernel.sum()), launch_bound=bound,
                      queue_mean=float(queue.mean()) if len(queue) else 0.0,
                      queue_max=int(queue.max()) if len(queue) else 0,
                      gap_us=float(gaps.mean()) if len(gaps) else None, comm_durations=self.dur[comm_index],
                      comm_kinds=tuple(collective_kind(self.names[i]) or "other"
                                       for i in self.trace.gpu_name[comm_index]))


def _counted(trace: RankTrace, launch_ts: np.ndarray) -> np.ndarray:
    """The GPU events of the rank totals. As HTA does, when the trace has two steps or more, the last one is left
    out (the profiler often stops inside it): only events launched by a CPU call that started before it count."""
    if len(trace.step_marks) < 2:
        return np.ones(len(trace.gpu_ts), bool)
    with np.errstate(invalid="ignore"):
        return launch_ts < max(trace.step_marks.values())


def _top_kernels(names: list[str], category_of: list[str], name_ids: np.ndarray, dur: np.ndarray,
                 top: int) -> list[dict[str, Any]]:
    """The kernels that took the most time, by the name a reader sees: template instantiations of one kernel
    (`vectorized_elementwise_kernel<4, ...>` for each op) add up under it, so no two rows share a name."""
    shown = [core_name(n)[:100] for n in names]
    ids = {name: i for i, name in enumerate(dict.fromkeys(shown))}
    group = np.array([ids[name] for name in shown], np.int64)[name_ids] if len(name_ids) else name_ids
    totals = np.bincount(group, weights=dur, minlength=len(ids))
    counts = np.bincount(group, minlength=len(ids))
    category = {}
    for i in np.argsort(np.bincount(name_ids, weights=dur, minlength=len(names)), kind="stable"):
        category[shown[i]] = category_of[i]  # ascending: the instantiation with the most time writes last
    busy = float(dur.sum()) or 1.0
    order = np.argsort(-totals, kind="stable")[:top]
    labels = list(ids)
    return [{"kernel": labels[i], "category": category[labels[i]], "calls": int(counts[i]),
             "total_ms": float(totals[i]) / 1e3, "mean_us": float(totals[i] / counts[i]),
             "kernel_time_pct": 100 * float(totals[i]) / busy} for i in order if counts[i]]


def _top_cpu_ops(cpu_ops: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    ranked = sorted(cpu_ops.items(), key=lambda item: -item[1][1])[:top]
    return [{"cpu_op": name[:100], "calls": int(calls), "total_ms": total / 1e3, "mean_us": total / calls}
            for name, (calls, total) in ranked]


def _collective_sizes(trace: RankTrace) -> list[dict[str, Any]]:
    """The NCCL kernels that state their message size, grouped by (kind, bytes, group size)."""
    groups: dict[tuple[str, int, int], list[float]] = {}
    for index, size, group in trace.comm_sizes.tolist():
        kind = collective_kind(trace.names[trace.gpu_name[int(index)]]) or "other"
        entry = groups.setdefault((kind, int(size), int(group)), [0, 0.0])
        entry[0] += 1
        entry[1] += float(trace.gpu_dur[int(index)])
    return [{"collective": kind, "bytes": size, "group_size": group, "calls": calls, "total_us": total,
             "mean_us": total / calls} for (kind, size, group), (calls, total) in sorted(groups.items())]
