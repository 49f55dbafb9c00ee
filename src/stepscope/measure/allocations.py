"""An allocation tracker for any device, CPU included: every block allocated and freed while tracking,
the op that allocated it, and the live-bytes timeline.

    with track_allocations("cpu") as trace:
        fn()
    trace.peak_bytes      # most bytes live at once during fn (blocks allocated before tracking not counted)

How: torch.profiler with `profile_memory=True`. PyTorch's CPU allocator (and CUDA's caching allocator)
report every allocation and free to an active profiler with its address and size; the profiler's event
tree puts each report under the op that made it. A free is matched to its allocation by address, so
blocks allocated before tracking began are ignored rather than counted negative. What it does not see:
memory that bypasses PyTorch's allocator (oneDNN scratch space, Python objects, the profiler itself).
On CUDA it counts allocated blocks like `torch.cuda.memory_allocated`, not the cache's reserved memory.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from stepscope.measure.categories import EVALUATE_PREFIX


@dataclass(frozen=True)
class Allocation:
    """One block allocated while tracking."""

    start_s: float
    """When it was allocated, in seconds since tracking began."""
    nbytes: int
    """Size in bytes."""
    op: str
    """The outermost op of the allocating call chain (`aten::linear`, `MmBackward0`, `Optimizer.step#...`)."""
    allocator_op: str
    """The innermost op, the one that asked the allocator (`aten::empty`, `aten::mm`, ...)."""
    end_s: float | None = None
    """When it was freed; None if still live when tracking stopped."""

    def live_at(self, time_s: float) -> bool:
        return self.start_s <= time_s and (self.end_s is None or self.end_s > time_s)


@dataclass
class AllocationTrace:
    """What `track_allocations` saw on one device (filled in when the `with` block ends)."""

    device: str = "cpu"
    """Device type tracked: cpu or cuda."""
    allocations: list[Allocation] = field(default_factory=list)
    """Every block allocated while tracking, in time order."""
    ranges: list[tuple[str, float, float]] = field(default_factory=list)
    """record_function ranges seen (name, start_s, end_s), e.g. the phases of a training step."""
    duration_s: float = 0.0
    """Time from the first to the last profiled event."""
    _times: list[float] = field(default_factory=list, repr=False)
    _live: list[int] = field(default_factory=list, repr=False)

    def timeline(self) -> tuple[list[float], list[int]]:
        """(times in seconds, live bytes right after each allocation or free), in time order."""
        return self._times, self._live

    def live_at(self, time_s: float) -> int:
        """Bytes live at `time_s` (allocated while tracking, not yet freed)."""
        i = bisect.bisect_right(self._times, time_s) - 1
        return self._live[i] if i >= 0 else 0

    def peak_between(self, start_s: float, end_s: float) -> int:
        """Most bytes live at any moment in [start_s, end_s]."""
        lo = bisect.bisect_left(self._times, start_s)
        hi = bisect.bisect_right(self._times, end_s)
        return max([self.live_at(start_s), *self._live[lo:hi]])

    @property
    def peak_bytes(self) -> int:
        return max(self._live, default=0)

    @property
    def final_bytes(self) -> int:
        return self._live[-1] if self._live else 0

    def _build_timeline(self) -> None:
        changes = [(a.start_s, a.nbytes) for a in self.allocations]
        changes += [(a.end_s, -a.nbytes) for a in self.allocations if a.end_s is not None]
        changes.sort(key=lambda change: change[0])
        live = 0
        self._times, self._live = [], []
        for time_s, delta in changes:
            live += delta
            self._times.append(time_s)
            self._live.append(live)


@contextlib.contextmanager
def track_allocations(device: torch.device | str = "cpu") -> Iterator[AllocationTrace]:
    """Track the allocations of `device` made inside the block; the yielded trace is filled at its end."""
    device_type = torch.device(device).type
    trace = AllocationTrace(device=device_type)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with quiet_native_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        yield trace
    _fill(trace, profiler.profiler.kineto_results.experimental_event_tree())


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 inside the block: Kineto writes two lines per profiler session there
    ("USDT: profiler_start/stop"), whatever its log level, which would interleave with the tables.
    Python errors are unaffected (they propagate as exceptions)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced (e.g. captured by pytest): nothing to do
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _fill(trace: AllocationTrace, roots: list[Any]) -> None:
    events: list[Any] = []
    stack = list(roots)
    while stack:
        event = stack.pop()
        events.append(event)
        stack.extend(event.children)
    if not events:
        return
    origin = min(e.start_time_ns for e in events)
    trace.duration_s = (max(_end_ns(e) for e in events) - origin) / 1e9
    reports = []
    for event in events:
        if _is_allocation(event):
            if torch.device(event.extra_fields.device).type == trace.device:
                reports.append(event)
        elif _is_range(event):
            trace.ranges.append((event.name, (event.start_time_ns - origin) / 1e9, (_end_ns(event) - origin) / 1e9))
    trace.ranges.sort(key=lambda r: r[1])
    reports.sort(key=lambda e: e.start_time_ns)
    open_blocks: dict[int, int] = {}  # address -> index into trace.allocations
    allocations: list[Allocation] = []
    for report in reports:
        fields, time_s = report.extra_fields, (report.start_time_ns - origin) / 1e9
        if fields.alloc_size > 0:
            op, allocator_op = _ops_of(report)
            open_blocks[fields.ptr] = len(allocations)
            allocations.append(Allocation(time_s, int(fields.alloc_size), op, allocator_op))
        elif fields.ptr in open_blocks:  # frees of blocks from before tracking are ignored
            i = open_blocks.pop(fields.ptr)
            a = allocations[i]
            allocations[i] = Allocation(a.start_s, a.nbytes, a.op, a.allocator_op, end_s=time_s)
    trace.allocations = allocations
    trace._build_timeline()


def _ops_of(report: Any) -> tuple[str, str]:
    """(outermost op, innermost op) above an allocation report; stepscope's phase ranges are skipped."""
    chain = []
    parent = report.parent
    while parent is not None:
        if not (parent.name.startswith("stepscope.") or parent.name.startswith("ProfilerStep")):
            chain.append(parent.name.removeprefix(EVALUATE_PREFIX))
        parent = parent.parent
    if not chain:
        return "(outside ops)", "(outside ops)"
    return chain[-1], chain[0]


def _is_allocation(event: Any) -> bool:
    return str(event.tag).endswith("Allocation")


def _is_range(event: Any) -> bool:
    return str(event.tag).endswith("TorchOp") and str(getattr(event.extra_fields, "scope", "")).endswith("USER_SCOPE")


def _end_ns(event: Any) -> int:
    return max(event.end_time_ns, event.start_time_ns)
