"""How work reached the GPU in one rank's trace: the CPU call that launched each GPU event, the work queued when it
was launched, the GPU's own gap before a queued kernel, and how long the host took to issue a step's work."""

from __future__ import annotations

import numpy as np

from stepscope.traces.read import RankTrace


def launches(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """Start and length of the CPU call that launched each GPU event (nan: none found)."""
    launch_ts = np.full(len(trace.gpu_ts), np.nan)
    launch_dur = np.full(len(trace.gpu_ts), np.nan)
    if len(trace.launch_corr) and len(trace.gpu_corr):
        order = np.argsort(trace.launch_corr, kind="stable")
        sorted_corr = trace.launch_corr[order]
        at = np.minimum(np.searchsorted(sorted_corr, trace.gpu_corr), len(sorted_corr) - 1)
        found = (sorted_corr[at] == trace.gpu_corr) & (trace.gpu_corr >= 0)
        launch_ts[found] = trace.launch_ts[order[at[found]]]
        launch_dur[found] = trace.launch_dur[order[at[found]]]
    return launch_ts, launch_dur


def queued_gaps(trace: RankTrace, start: np.ndarray, end: np.ndarray, issued: np.ndarray) -> np.ndarray:
    """Per GPU event, its start minus the end of the event before it on its stream, where its launch call returned
    (`issued`) before that end: it waited in the queue, so the gap is the GPU's (nan elsewhere)."""
    gaps = np.full(len(start), np.nan)
    order = np.lexsort((start, trace.gpu_stream))
    same = trace.gpu_stream[order[1:]] == trace.gpu_stream[order[:-1]]
    event, before = order[1:][same], order[:-1][same]
    with np.errstate(invalid="ignore"):
        queued = issued[event] < end[before]
    gaps[event[queued]] = np.maximum(start[event[queued]] - end[before[queued]], 0.0)
    return gaps


def queue_lengths(launch: np.ndarray, end: np.ndarray) -> np.ndarray:
    """GPU work outstanding when each event was launched (launched, not finished; itself included)."""
    launches, ends = np.sort(launch), np.sort(end)
    return np.searchsorted(launches, launch, "right") - np.searchsorted(ends, launch, "right")


def host_issue_us(issued: np.ndarray, mask: np.ndarray, cpu_start: float) -> float | None:
    """From a step's CPU start to the return of the last launch call of its GPU events (`issued`: when each event's
    call returned, nan without one): the host's time to issue the step, whatever the GPU did meanwhile; None
    without launch calls (a CPU trace)."""
    calls = issued[mask]
    calls = calls[~np.isnan(calls)]
    return float(calls.max() - cpu_start) if len(calls) else None
