"""The system calls of each traced process inside marked time windows, tallied per kind.

The traced program marks a window with two failing `readlink` calls on paths that cannot exist:
`/stepscope-syscall-mark/begin/<rank>/<tasks>/<key>` and `.../end/<rank>/0/<key>`, where `tasks` is the number
of entries of the rank's `/proc/self/task` (the kernel's list of its threads) when the window opened. A rank may
open and close the same window several times (interleaved rounds): its spans add up. A rank process's calls
count inside its own spans; any other process of the traced tree (a launcher, an MPI daemon, a switch) counts
inside the union of the ranks' spans. A call counts when it starts inside, and
its time up to the window's end (a wait that outlasts the window is cut there).

Besides the calls, a window's tally says how many processes and threads were alive in it (threads whose first
and last traced line enclose part of it, from the clone calls that made them) and how many made a call.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.distributed.tracing.strace import ThreadTrace, process_of
from stepscope.distributed.tracing.syscall_kinds import KINDS, moved_bytes, syscall_kind

MARK_ROOT = "/stepscope-syscall-mark"
MARK_ENV = "STEPSCOPE_SYSCALL_MARKS"
"""Set (to 1) in the traced program's environment: it then marks its windows (`window_marker`)."""
_MARK = re.compile(r'^"' + re.escape(MARK_ROOT) + r'/(begin|end)/(\d+)/(\d+)/([^"]+)"')


def window_marker(rank: int, key: str) -> Callable[[str], None]:
    """`mark("begin")` / `mark("end")` around the calls to tally, or a no-op without MARK_ENV (untraced runs
    make no extra call at all). The task count is read before the begin mark, so it is outside the window."""
    if not os.environ.get(MARK_ENV):
        return lambda edge: None
    safe = window_name(key)

    def mark(edge: str) -> None:
        tasks = len(os.listdir("/proc/self/task")) if edge == "begin" else 0
        try:
            os.readlink(f"{MARK_ROOT}/{edge}/{rank}/{tasks}/{safe}")
        except OSError:  # the path never exists: the failing call is the mark
            pass

    return mark


def window_name(key: str) -> str:
    """The name a window of `key` has in the trace (and in `find_windows`): characters a path could not carry
    safely become `_`."""
    return re.sub(r"[^\w.:=-]", "_", key)


@dataclass
class RankMarks:
    """One rank's marks of a window: its process, its task count at the first begin, its closed spans."""

    pid: int
    tasks: int = 0
    spans: list[tuple[float, float]] = field(default_factory=list)
    opened: float | None = None


@dataclass
class Window:
    """One marked window on every rank; a rank may open and close it several times (interleaved rounds)."""

    key: str
    ranks: dict[int, RankMarks] = field(default_factory=dict)

    def span(self) -> tuple[float, float]:
        return (min(s[0] for r in self.ranks.values() for s in r.spans),
                max(s[1] for r in self.ranks.values() for s in r.spans))

    def merged(self) -> list[tuple[float, float]]:
        """The union of every rank's spans: when any rank was inside (what helper processes are counted over)."""
        out: list[tuple[float, float]] = []
        for begin, end in sorted(s for r in self.ranks.values() for s in r.spans):
            if out and begin <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((begin, end))
        return out


def find_windows(threads: dict[int, ThreadTrace]) -> dict[str, Window]:
    """Every window with at least one closed span on each of its ranks, by key, in the order they opened."""
    pids = process_of(threads)
    windows: dict[str, Window] = {}
    marks = []
    for thread in threads.values():
        for call in thread.calls:
            if call.name not in ("readlink", "readlinkat"):
                continue
            match = _MARK.match(call.args.split(", ", 1)[1] if call.name == "readlinkat" else call.args)
            if match is not None:
                marks.append((call.ts, match.group(1), int(match.group(2)), int(match.group(3)), match.group(4),
                              pids[thread.tid]))
    for ts, edge, rank, tasks, key, pid in sorted(marks):
        entry = windows.setdefault(key, Window(key)).ranks.setdefault(rank, RankMarks(pid))
        if edge == "begin":
            entry.opened, entry.tasks = ts, entry.tasks or tasks
        elif entry.opened is not None:
            entry.spans.append((entry.opened, ts))
            entry.opened = None
    complete = {k: w for k, w in windows.items() if all(r.spans for r in w.ranks.values())}
    return dict(sorted(complete.items(), key=lambda item: item[1].span()[0]))


def _inside(spans: list[tuple[float, float]], ts: float) -> float | None:
    """The end of the span holding `ts`, or None."""
    index = bisect.bisect_right(spans, (ts, float("inf"))) - 1
    if index >= 0 and spans[index][0] <= ts <= spans[index][1]:
        return spans[index][1]
    return None


def tally_window(threads: dict[int, ThreadTrace], window: Window) -> dict[str, Any]:
    """The calls inside one window, per kind and per name, with the processes and threads alive in it."""
    pids = process_of(threads)
    rank_spans = {r.pid: sorted(r.spans) for r in window.ranks.values()}
    helpers = window.merged()
    first, last = window.span()
    kinds: dict[str, dict[str, float]] = {k: {"calls": 0, "time_us": 0.0, "bytes": 0, "errors": 0} for k in KINDS}
    names: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    alive: set[int] = set()
    active: set[int] = set()
    for tid, thread in threads.items():
        spans = rank_spans.get(pids[tid], helpers)
        if thread.first_ts <= last and thread.last_ts >= first:
            alive.add(tid)
        for call in thread.calls:
            end = _inside(spans, call.ts)
            if end is None or call.name in ("readlink", "readlinkat") and MARK_ROOT in call.args:
                continue
            kind = syscall_kind(call)
            slot = kinds[kind]
            slot["calls"] += 1
            inside_us = (min(call.ts + call.dur_s, end) - call.ts) * 1e6  # a wait may outlast the window
            slot["time_us"] += inside_us
            slot["bytes"] += moved_bytes(call, kind)
            slot["errors"] += call.error is not None
            names[call.name][0] += 1
            names[call.name][1] += inside_us
            active.add(tid)
    processes = {pids[t] for t in alive}
    return {"kinds": kinds, "syscalls": {n: {"calls": c, "time_us": t} for n, (c, t) in names.items()},
            "processes": len(processes), "threads": len(alive), "active_threads": len(active),
            "rank_processes": len(rank_spans), "rank_tasks": sum(r.tasks for r in window.ranks.values()),
            "spans": sum(len(r.spans) for r in window.ranks.values()),
            "programs": sorted({Path(threads[p].exe).name for p in processes if p in threads and threads[p].exe}),
            "window_s": sum(end - begin for begin, end in helpers)}
