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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepscope.traces.read import RankTrace

CPU, IDLE = "cpu", "gpu idle"
BLOCKING = re.compile(r"Synchronize|^(cuda|hip)Memcpy(2D)?$")
"""Runtime calls that block the CPU thread until the GPU has done the work before them."""


@dataclass(frozen=True)
class StepPath:
    """The critical path of one step: its length and its time per category (ms)."""

    step: int
    path_ms: float
    categories: dict[str, float]

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


def critical_path(trace: RankTrace, category_of: list[str], anchor: np.ndarray) -> list[StepPath]:
    """One StepPath per step of the trace (none without ProfilerStep ranges)."""
    if not trace.steps or not len(trace.gpu_ts):
        return []
    graph = _Graph(trace, category_of)
    out = []
    for number, cpu_start, cpu_end in trace.steps:
        mine = np.flatnonzero((anchor >= cpu_start) & (anchor <= cpu_end))
        if not len(mine):
            continue
        last = int(mine[np.argmax(graph.end[mine])])
        out.append(StepPath(number, (graph.end[last] - cpu_start) / 1e3,
                            {c: us / 1e3 for c, us in graph.walk(last, cpu_start).items() if us > 0}))
    return out


class _Graph:
    """Each GPU event's predecessors (stream order, launch, waited-on event) and each thread's blocking calls."""

    def __init__(self, trace: RankTrace, category_of: list[str]) -> None:
        n = len(trace.gpu_ts)
        self.start, self.end = trace.gpu_ts, trace.gpu_ts + trace.gpu_dur
        self.category = [category_of[i] for i in trace.gpu_name.tolist()]
        order = np.lexsort((self.start, trace.gpu_stream))
        self.previous = np.full(n, -1, np.int64)
        same = trace.gpu_stream[order[1:]] == trace.gpu_stream[order[:-1]]
        self.previous[order[1:][same]] = order[:-1][same]
        # the CPU call that launched each event
        self.launch = np.full(n, -1, np.int64)
        if len(trace.launch_corr):
            by_corr = np.argsort(trace.launch_corr, kind="stable")
            at = np.minimum(np.searchsorted(trace.launch_corr[by_corr], trace.gpu_corr), len(by_corr) - 1)
            found = (trace.launch_corr[by_corr][at] == trace.gpu_corr) & (trace.gpu_corr >= 0)
            self.launch[found] = by_corr[at[found]]
        self.launch_start, self.launch_end = trace.launch_ts, trace.launch_ts + trace.launch_dur
        self.launch_tid = trace.launch_tid
        self.waited = self._waits(trace, by_corr if len(trace.launch_corr) else None)
        blocking = np.array([bool(BLOCKING.search(name)) for name in trace.launch_names], bool)
        self.blocking: dict[int, np.ndarray] = {}
        if len(trace.launch_name):
            calls = np.flatnonzero(blocking[trace.launch_name])
            for tid in np.unique(trace.launch_tid[calls]).tolist():
                mine = calls[trace.launch_tid[calls] == tid]
                self.blocking[tid] = mine[np.argsort(self.launch_end[mine])]
        self.by_end = np.argsort(self.end, kind="stable")

    def _waits(self, trace: RankTrace, by_corr: np.ndarray | None) -> dict[int, int]:
        """Stream Wait Event index -> the event it waited for."""
        out: dict[int, int] = {}
        if by_corr is None or not len(trace.waits):
            return out
        sorted_corr = trace.launch_corr[by_corr]
        launched = np.where(self.launch >= 0, trace.launch_ts[np.maximum(self.launch, 0)], trace.gpu_ts)
        for index, stream, record in trace.waits.tolist():
            at = int(np.searchsorted(sorted_corr, record))
            if at >= len(sorted_corr) or sorted_corr[at] != record:
                continue
            recorded = trace.launch_ts[by_corr[at]]
            candidates = np.flatnonzero((trace.gpu_stream == stream) & (launched < recorded))
            if len(candidates):
                out[index] = int(candidates[np.argmax(launched[candidates])])
        return out

    def walk(self, node: int, floor: float) -> dict[str, float]:
        """µs per category of the path from the end of GPU event `node` back to `floor`."""
        path = _Path(float(self.end[node]), floor)
        for _ in range(len(self.start) + 16):
            if path.frontier <= floor:
                break
            path.take(self.category[node], float(self.start[node]))
            ready, after = -np.inf, None  # the latest predecessor to be ready
            for kind, index, time in self._predecessors(node):
                if time > ready:
                    ready, after = time, (kind, index)
            if after is None:
                path.take(IDLE, floor)
                break
            path.take(IDLE, ready)
            kind, index = after
            if kind == "gpu":
                node = index
                continue
            found = self._cpu(index, path)
            if found is None:
                break
            node = found
        return path.spent

    def _predecessors(self, node: int):
        if self.previous[node] >= 0:
            yield "gpu", int(self.previous[node]), float(self.end[self.previous[node]])
        if self.launch[node] >= 0:
            yield "cpu", int(self.launch[node]), float(self.launch_end[self.launch[node]])
        if node in self.waited:
            yield "gpu", self.waited[node], float(self.end[self.waited[node]])

    def _cpu(self, call: int, path: _Path) -> int | None:
        """Back along the launch call's thread to the GPU event its last blocking call waited for (None: to the
        step's start)."""
        calls = self.blocking.get(int(self.launch_tid[call]))
        at = call
        while True:
            blocking = None
            if calls is not None:
                before = int(np.searchsorted(self.launch_end[calls], self.launch_start[at], "right")) - 1
                blocking = int(calls[before]) if before >= 0 else None
            if blocking is None or self.launch_end[blocking] <= path.floor:
                path.take(CPU, path.floor)
                return None
            path.take(CPU, float(self.launch_end[blocking]))
            # the GPU event that ended last before the call returned, if it ended while the call waited
            last = int(np.searchsorted(self.end[self.by_end], self.launch_end[blocking], "right")) - 1
            if last >= 0:
                event = int(self.by_end[last])
                if self.end[event] >= self.launch_start[blocking]:
                    path.take(CPU, float(self.end[event]))
                    return event
            at = blocking  # the call did not wait: host work, go on back along the thread


class _Path:
    """The walk's state: how far back it has come (`frontier`) and the time taken per category."""

    def __init__(self, frontier: float, floor: float) -> None:
        self.frontier, self.floor = frontier, floor
        self.spent: dict[str, float] = {}

    def take(self, category: str, until: float) -> None:
        """Count [until, frontier] (clipped to the floor) for `category` and move the frontier there."""
        until = max(until, self.floor)
        if until < self.frontier:
            self.spent[category] = self.spent.get(category, 0.0) + self.frontier - until
            self.frontier = until
