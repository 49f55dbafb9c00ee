"""The critical path of each step of one rank: the chain of work that set the step's length, across the CPU
launch thread(s) and the GPU streams, and how much of it each category is.

Walked backwards from the GPU event that ends last among those the step launched, to the start of the step's CPU
range (`ProfilerStep#N`). At a GPU event the path takes its run time (its kernel category), then what let it start,
the latest to be ready of: the previous event on its stream (stream order), the CPU call that launched it (matched
by correlation id), and, in traces recorded with CUDA sync events, the event a `Stream Wait Event` waited for (the
last event on the waited-on stream launched before the `cudaEventRecord` it names: a cross-stream sync). Time
between that readiness and the start is `gpu idle` (the GPU had what it needed and had not started: launch
latency). From a launch call the path goes back along its CPU thread as `cpu` (host work: Python, dispatch,
launching) to the last blocking call before it (`cudaDeviceSynchronize`, `cudaStreamSynchronize`, ...,
`cudaMemcpy`), and from there to the GPU event that call waited for; or to the step's start. Every moment between
the step's CPU start and its last GPU end is counted once, so the categories add up to `path_ms`.

A CPU trace (stepscope's own `profile --trace`) has no launches: its top-level ops follow one another on their
thread, and the gaps between them are `gpu idle` (host time outside any op).

For the path across ranks (`traces/critical_path_ranks.py`) each step is also cut at its collectives (the
communication kernels of a `SYNCHRONISING` kind it launched, in launch order): before collective i, the rank's
arrival gap, from the end of collective i−1 (the first: from the step's CPU start) to the start of collective i,
and the categories of the path walked back from that start to that floor; then the collective's duration; after
the last one, the tail to the step's last GPU end, walked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepscope.traces.read import RankTrace

CPU, IDLE = "cpu", "gpu idle"
SYNCHRONISING = frozenset(("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                           "gather", "scatter"))
"""Collectives every rank of a group leaves together (a point-to-point send or receive only pairs two ranks, and a
kernel of unknown kind says nothing): the ones a step is cut at."""
BLOCKING = re.compile(r"Synchronize|^(cuda|hip)Memcpy(2D)?$")
"""Runtime calls that block the CPU thread until the GPU has done the work before them."""


@dataclass(frozen=True)
class Segment:
    """The part of a rank's step before one of its collectives (or after the last one: `kind` None)."""

    kind: str | None
    """The collective that ends the segment (`all_reduce`, ...; None: the tail after the last collective)."""
    gap_us: float
    """From the end of the previous collective (or the step's CPU start) to this collective's start (the tail: to
    the step's last GPU end); 0 where the collective started before the previous one ended."""
    duration_us: float
    """The collective kernel's duration (0 for the tail)."""
    categories: dict[str, float]
    """µs per category of the path through the gap."""


@dataclass(frozen=True)
class StepPath:
    """The critical path of one step: its length and its time per category (ms)."""

    step: int
    path_ms: float
    categories: dict[str, float]
    segments: tuple[Segment, ...] = ()
    """The step cut at its collectives, the tail last (see the module docstring)."""

    @property
    def bound_by(self) -> str:
        """`cpu` (host / launch bound), `gpu idle`, or the kernel category with the most time on the path."""
        return max(self.categories, key=self.categories.get) if self.categories else ""

    def metrics(self) -> dict[str, float | str]:
        total = self.path_ms or 1.0
        kernel = sum(ms for c, ms in self.categories.items() if c not in (CPU, IDLE))
        return {"path_ms": self.path_ms, "bound_by": self.bound_by, "gpu_kernel_pct": 100 * kernel / total,
                "cpu_pct": 100 * self.categories.get(CPU, 0.0) / total,
                "gpu_idle_pct": 100 * self.categories.get(IDLE, 0.0) / total}


def critical_path(trace: RankTrace, category_of: list[str], anchor: np.ndarray, collective: list[str | None],
                  is_comm: np.ndarray) -> list[StepPath]:
    """One StepPath per step of the trace (none without ProfilerStep ranges); `collective` is the kind of each GPU
    event name, `is_comm` marks the communication kernels."""
    if not trace.steps or not len(trace.gpu_ts):
        return []
    graph = _Graph(trace, category_of)
    ends = trace.gpu_ts + trace.gpu_dur
    out = []
    for number, cpu_start, cpu_end in trace.steps:
        mine = np.flatnonzero((anchor >= cpu_start) & (anchor <= cpu_end))
        if not len(mine):
            continue
        last = int(mine[np.argmax(ends[mine])])
        comm = mine[is_comm[mine]]
        comm = [i for i in comm[np.argsort(anchor[comm], kind="stable")].tolist()  # launch order
                if collective[trace.gpu_name[i]] in SYNCHRONISING]
        spent = {c: us for c, us in graph.walk(last, cpu_start).items() if us > 0}
        segments = _segments(graph, comm, last, cpu_start, trace, collective) if comm else \
            (Segment(None, graph.end[last] - cpu_start, 0.0, spent),)  # no collective: the tail is the path
        out.append(StepPath(number, (graph.end[last] - cpu_start) / 1e3, {c: us / 1e3 for c, us in spent.items()},
                            segments))
    return out


def _segments(graph: _Graph, comm: list[int], last: int, floor: float, trace: RankTrace,
              collective: list[str | None]) -> tuple[Segment, ...]:
    out = []
    for event in comm:
        start = graph.start[event]
        spent = graph.walk(event, floor, from_start=True) if start > floor else {}
        out.append(Segment(collective[trace.gpu_name[event]], max(start - floor, 0.0),
                           graph.end[event] - start, {c: us for c, us in spent.items() if us > 0}))
        floor = max(floor, graph.end[event])
    end = graph.end[last]
    spent = graph.walk(last, floor) if end > floor else {}
    out.append(Segment(None, max(end - floor, 0.0), 0.0, {c: us for c, us in spent.items() if us > 0}))
    return tuple(out)


GPU, CALL = 0, 1


class _Graph:
    """Each GPU event's latest-ready predecessor (stream order, launch, waited-on event) and, per runtime call, the
    last blocking call before it on its thread and the GPU event a blocking call waited for, all found at once with
    numpy; the walk then only follows them (Python lists: a walk visits thousands of events)."""

    def __init__(self, trace: RankTrace, category_of: list[str]) -> None:
        n = len(trace.gpu_ts)
        start, end = trace.gpu_ts, trace.gpu_ts + trace.gpu_dur
        self.start, self.end = start.tolist(), end.tolist()
        self.category = [category_of[i] for i in trace.gpu_name.tolist()]
        order = np.lexsort((start, trace.gpu_stream))
        previous = np.full(n, -1, np.int64)
        same = trace.gpu_stream[order[1:]] == trace.gpu_stream[order[:-1]]
        previous[order[1:][same]] = order[:-1][same]
        launch = np.full(n, -1, np.int64)  # the CPU call that launched each event
        by_corr = np.argsort(trace.launch_corr, kind="stable")
        if len(trace.launch_corr):
            at = np.minimum(np.searchsorted(trace.launch_corr[by_corr], trace.gpu_corr), len(by_corr) - 1)
            found = (trace.launch_corr[by_corr][at] == trace.gpu_corr) & (trace.gpu_corr >= 0)
            launch[found] = by_corr[at[found]]
        call_start, call_end = trace.launch_ts, trace.launch_ts + trace.launch_dur
        waited = self._waits(trace, by_corr, launch)
        # predecessors in the order a tie is decided (the first wins): stream order, launch, waited-on event
        ready = np.stack([np.where(previous >= 0, end[np.maximum(previous, 0)], -np.inf),
                          np.where(launch >= 0, call_end[np.maximum(launch, 0)] if len(call_end) else 0, -np.inf),
                          np.where(waited >= 0, end[np.maximum(waited, 0)], -np.inf)])
        best = np.argmax(ready, axis=0)
        self.ready = ready[best, np.arange(n)].tolist()
        self.kind = np.where(best == 1, CALL, GPU).tolist()
        self.after = np.choose(best, [previous, launch, waited]).tolist()
        self.call_start, self.call_end = call_start.tolist(), call_end.tolist()
        self.blocking_before, self.waited_for = self._blocking(trace, call_start, call_end, end)

    @staticmethod
    def _waits(trace: RankTrace, by_corr: np.ndarray, launch: np.ndarray) -> np.ndarray:
        """For each `Stream Wait Event`, the event it waited for (−1 elsewhere)."""
        waited = np.full(len(trace.gpu_ts), -1, np.int64)
        if not len(trace.launch_corr) or not len(trace.waits):
            return waited
        sorted_corr = trace.launch_corr[by_corr]
        launched = np.where(launch >= 0, trace.launch_ts[np.maximum(launch, 0)], trace.gpu_ts)
        for index, stream, record in trace.waits.tolist():
            at = int(np.searchsorted(sorted_corr, record))
            if at >= len(sorted_corr) or sorted_corr[at] != record:
                continue
            recorded = trace.launch_ts[by_corr[at]]
            candidates = np.flatnonzero((trace.gpu_stream == stream) & (launched < recorded))
            if len(candidates):
                waited[index] = int(candidates[np.argmax(launched[candidates])])
        return waited

    @staticmethod
    def _blocking(trace: RankTrace, call_start: np.ndarray, call_end: np.ndarray,
                  end: np.ndarray) -> tuple[list[int], list[int]]:
        """Per runtime call, the last blocking call on its thread that returned before it started (−1: none); per
        blocking call, the GPU event that ended last before it returned, if that was while it waited (−1: none)."""
        before = np.full(len(call_start), -1, np.int64)
        waited_for = np.full(len(call_start), -1, np.int64)
        if not len(trace.launch_name):
            return before.tolist(), waited_for.tolist()
        is_blocking = np.array([bool(BLOCKING.search(name)) for name in trace.launch_names], bool)
        calls = np.flatnonzero(is_blocking[trace.launch_name])
        for tid in sorted(set(trace.launch_tid[calls].tolist())):
            mine = calls[trace.launch_tid[calls] == tid]
            mine = mine[np.argsort(call_end[mine], kind="stable")]
            rows = np.flatnonzero(trace.launch_tid == tid)
            at = np.searchsorted(call_end[mine], call_start[rows], "right") - 1
            before[rows[at >= 0]] = mine[at[at >= 0]]
        by_end = np.argsort(end, kind="stable")
        last = np.searchsorted(end[by_end], call_end[calls], "right") - 1
        event = by_end[np.maximum(last, 0)]
        ok = (last >= 0) & (end[event] >= call_start[calls])
        waited_for[calls[ok]] = event[ok]
        return before.tolist(), waited_for.tolist()

    def walk(self, node: int, floor: float, from_start: bool = False) -> dict[str, float]:
        """µs per category of the path from the end of GPU event `node` (`from_start`: from its start, the event
        itself left out) back to `floor`."""
        path = _Path(self.start[node] if from_start else self.end[node], floor)
        start, category, after_of, ready, kind = self.start, self.category, self.after, self.ready, self.kind
        spent = path.spent
        for _ in range(len(start) + 16):
            # the path's steps, `_Path.take` written out: a walk takes millions of them on a large trace
            frontier = path.frontier
            if frontier <= floor:
                break
            until = max(start[node], floor)
            if until < frontier:
                spent[category[node]] = spent.get(category[node], 0.0) + frontier - until
                frontier = until
            after = after_of[node]
            if after < 0:
                path.frontier = frontier
                path.take(IDLE, floor)
                break
            until = max(ready[node], floor)
            if until < frontier:
                spent[IDLE] = spent.get(IDLE, 0.0) + frontier - until
                frontier = until
            path.frontier = frontier
            if kind[node] == GPU:
                node = after
                continue
            found = self._cpu(after, path)
            if found is None:
                break
            node = found
        return spent

    def _cpu(self, call: int, path: _Path) -> int | None:
        """Back along the launch call's thread to the GPU event its last blocking call waited for (None: to the
        step's start)."""
        at = call
        while True:
            blocking = self.blocking_before[at]
            if blocking < 0 or self.call_end[blocking] <= path.floor:
                path.take(CPU, path.floor)
                return None
            path.take(CPU, self.call_end[blocking])
            event = self.waited_for[blocking]
            if event >= 0:
                path.take(CPU, self.end[event])
                return event
            at = blocking  # the call did not wait: host work, go on back along the thread


class _Path:
    """The walk's state: how far back it has come (`frontier`) and the time taken per category."""

    def __init__(self, frontier: float, floor: float) -> None:
        self.frontier, self.floor = frontier, floor
        self.spent: dict[str, float] = {}

    def take(self, category: str, until: float) -> None:
        """Count [until, frontier] (clipped to the floor) for `category` and move the frontier there."""
        if until < self.floor:
            until = self.floor
        if until < self.frontier:
            self.spent[category] = self.spent.get(category, 0.0) + self.frontier - until
            self.frontier = until
