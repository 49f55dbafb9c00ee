"""Interval arithmetic on numpy arrays: merge, union length, overlap of two sets, clipping to a window.

Intervals are (start, end) arrays of equal length; a merged set is sorted and disjoint. Touching intervals
(one starts where the other ends) are merged, as HolisticTraceAnalysis merges them.
"""

from __future__ import annotations

import numpy as np

EMPTY = (np.zeros(0), np.zeros(0))


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals as sorted, disjoint intervals."""
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def length(merged: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of a merged set."""
    return float(np.sum(merged[1] - merged[0]))


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two merged sets."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    steps = np.concatenate([np.full(len(a[0]), 1), np.full(len(a[0]), -1), np.full(len(b[0]), 2),
                            np.full(len(b[0]), -2)])
    order = np.lexsort((steps, times))  # at equal times ends (negative) come first: touching is not overlapping
    times, running = times[order], np.cumsum(steps[order])
    return float(np.sum(np.diff(times)[running[:-1] == 3]))


def clip(merged: tuple[np.ndarray, np.ndarray], start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """A merged set cut to the window [start, end] (binary search: the cost is that of the window's intervals)."""
    first = int(np.searchsorted(merged[1], start, "right"))
    last = int(np.searchsorted(merged[0], end, "left"))
    s, e = np.clip(merged[0][first:last], start, end), np.clip(merged[1][first:last], start, end)
    keep = e > s
    return s[keep], e[keep]
