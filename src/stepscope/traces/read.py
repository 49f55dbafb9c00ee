"""Read one Kineto / Chrome trace file (`.json` or `.json.gz`) into compact columns: GPU events, CPU runtime calls
(launches, event records, syncs), ProfilerStep ranges, CPU-op totals, and the FLOPs and bytes of every op whose
shapes were recorded. Nothing of the file's text is kept.

The events are decoded into typed structs (`traces/events.py`; a large file a block at a time) and sorted into numpy
columns a block at a time (`traces/columns.py`), so memory grows with the columns kept (a few numbers per GPU
event, launch and costed op), never with the file beyond `events.WHOLE_BYTES`. Every failure to read
is one UsageError line naming the file.
"""

from __future__ import annotations

import gc
import gzip
import os
import sys
import zlib
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.errors import UsageError
from stepscope.traces import events
from stepscope.traces.block import Block, read_block
from stepscope.traces.columns import Columns
from stepscope.traces.opcost import OpCost
from stepscope.traces.read_dicts import CountingReader, Progress, text_size

STEPSCOPE_RANGE = "stepscope."


@dataclass
class RankTrace:
    """One file's events, as numpy columns (times in µs, as in the trace)."""

    path: Path
    meta: dict[str, Any]
    names: list[str]
    """GPU event names; `gpu_name` indexes them."""
    gpu_ts: np.ndarray
    gpu_dur: np.ndarray
    gpu_name: np.ndarray
    gpu_stream: np.ndarray
    gpu_corr: np.ndarray
    launch_corr: np.ndarray
    """Correlation ids of CPU runtime calls (cudaLaunchKernel, cudaMemcpyAsync, ...), with their start and length."""
    launch_ts: np.ndarray
    launch_dur: np.ndarray
    steps: list[tuple[int, float, float]]
    """(N, start, end) of each `ProfilerStep#N` CPU range, by start."""
    cpu_ops: dict[str, list[float]]
    """CPU op name -> [calls, total µs] (inclusive time)."""
    step_marks: dict[int, float] = field(default_factory=dict)
    """N -> latest start of a CPU-side `ProfilerStep#N` event of any category (HTA's rule for the last step)."""
    device: str = "GPU"
    """`GPU`, or `CPU` for a CPU-only trace of stepscope's own `profile --trace` (its top-level ops are the work)."""
    events: int = 0
    float_times: bool = False
    """Timestamps carry fractions of a µs (ns resolution): HTA then rounds each event inward to whole µs."""
    launch_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Thread (a code per thread of the file) of each runtime call."""
    launch_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    launch_names: list[str] = field(default_factory=list)
    """Runtime call names; `launch_name` indexes them."""
    waits: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    """(GPU event index, stream waited on, correlation of the cudaEventRecord waited for) of each `Stream Wait
    Event` (traces recorded with CUDA sync events)."""
    op_keys: list[OpCost] = field(default_factory=list)
    """Each distinct (op, shape, precision) with a cost; `op_key` indexes them (with `op_names`)."""
    op_names: list[str] = field(default_factory=list)
    op_key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    op_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    op_ts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    op_dur: np.ndarray = field(default_factory=lambda: np.zeros(0))
    shapes: bool = False
    """The trace was recorded with shapes (some op carries `Input Dims`)."""
    comm_sizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    """(GPU event index, bytes in, group size) of communication kernels whose args give their message size."""

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.meta.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def device_name(self) -> str:
        if self.device == "CPU":
            return "CPU"
        props = self.meta.get("deviceProperties")
        if isinstance(props, list) and props and isinstance(props[0], dict) and props[0].get("name"):
            return str(props[0]["name"])
        return self.device


def read_trace(path: str | os.PathLike, progress: Progress | None = None, workers: int = 1) -> RankTrace:
    """One trace file as a RankTrace; UsageError (one line) for a file that is not a complete trace. A file of more
    than `events.WHOLE_BYTES` of JSON is decoded by `workers` processes, a block each at a time, when `workers` > 1
    (the blocks are merged in file order; a block whose guessed cut was wrong makes the file be read again here,
    its cuts proven one by one)."""
    path = Path(path)
    collecting = gc.isenabled()
    gc.disable()  # many small objects and no cycles: the cyclic collector would only rescan them
    try:
        meta: dict[str, Any] = {}
        columns = Columns()
        if workers > 1 and text_size(path) > events.WHOLE_BYTES and _read_parallel(path, progress, meta, columns,
                                                                                    workers):
            return _finish(path, meta, columns)
        meta, columns = {}, Columns()
        with _open(path, progress) as source:
            for block in events.iter_events(source, meta):
                columns.merge(read_block(block))
    except (OSError, EOFError, zlib.error, ValueError, TypeError, KeyError, msgspec.MsgspecError) as error:
        if isinstance(error, ValueError) and "traceEvents" in str(error):
            raise UsageError(f"not a PyTorch profiler trace: {path} (no traceEvents list)") from None
        reason = "truncated or corrupt" if not isinstance(error, OSError) or "gzip" in str(error).lower() \
            else (error.strerror or str(error))
        raise UsageError(f"cannot read trace {path}: {reason} ({type(error).__name__})") from None
    finally:
        if collecting:
            gc.enable()
    return _finish(path, meta, columns)


@contextmanager
def _open(path: Path, progress: Progress | None) -> Iterator[CountingReader]:
    with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
        yield CountingReader(raw, handle, progress)


def _read_parallel(path: Path, progress: Progress | None, meta: dict[str, Any], columns: Columns,
                   workers: int) -> bool:
    """Blocks decoded by worker processes, merged here in file order, at most `workers` + 1 in flight; False where
    a guessed cut was wrong (nothing of it is kept)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pending: deque = deque()
    with _open(path, progress) as source, ProcessPoolExecutor(workers, mp_context=context) as pool:
        try:
            for text in events.iter_texts(source, meta):
                pending.append(pool.submit(_read_text, text))
                while len(pending) > workers:
                    if not _merge(columns, pending.popleft().result()):
                        return False
            while pending:
                if not _merge(columns, pending.popleft().result()):
                    return False
        finally:
            for future in pending:
                future.cancel()
    return True


def _read_text(text: bytes) -> Block | None:
    """A worker's part: one block's text decoded and sorted into columns (None: not a list of whole events)."""
    decoded = events.decode(text)
    return None if decoded is None else read_block(decoded)


def _merge(columns: Columns, block: Block | None) -> bool:
    if block is not None:
        columns.merge(block)
    return block is not None


def _finish(path: Path, meta: dict[str, Any], columns: Columns) -> RankTrace:
    g_ts, g_dur, g_name, g_stream, g_corr = _joined(columns.gpu, (np.float64, np.float64, np.int64, np.int64, np.int64))
    names = list(columns.gpu_names)
    device = "GPU"
    host_names = list(columns.host_names)
    calls = columns.cpu_calls
    cpu_ops = {host_names[i]: [int(calls[i]), float(columns.cpu_time[i])] for i in np.flatnonzero(calls).tolist()}
    if not len(g_ts):
        if not any(name.startswith(STEPSCOPE_RANGE) for name in cpu_ops) or not columns.cpu_top:
            raise UsageError(f"no GPU events in {path} (no kernels, copies or syncs on a GPU stream)")
        device = "CPU"
        g_ts, g_dur, g_name, names = _cpu_work(_joined(columns.cpu_top, (np.int64, np.float64, np.float64, np.int64)),
                                               host_names)
        g_stream = np.zeros(len(g_ts), np.int64)
        g_corr = np.full(len(g_ts), -1, np.int64)
    l_corr, l_ts, l_dur, l_tid, l_host = _joined(columns.launch, (np.int64, np.float64, np.float64, np.int64, np.int64))
    # the runtime calls' names, in the order they were first seen (a dict, not np.unique: that imports numpy.ma)
    order = np.array(list(dict.fromkeys(l_host.tolist())), np.int64)
    launch_code = np.full(len(host_names), -1, np.int64)
    launch_code[order] = np.arange(len(order))
    o_key, o_tid, o_ts, o_dur = _joined(columns.ops, (np.int64, np.int64, np.float64, np.float64))
    costs = columns.costs
    return RankTrace(path=path, meta=meta, names=names, gpu_ts=np.asarray(g_ts, np.float64),
                     gpu_dur=np.asarray(g_dur, np.float64), gpu_name=np.asarray(g_name, np.int64),
                     gpu_stream=g_stream, gpu_corr=g_corr, launch_corr=l_corr, launch_ts=l_ts, launch_dur=l_dur,
                     steps=sorted(columns.steps, key=lambda s: s[1]), step_marks=columns.step_marks,
                     cpu_ops=cpu_ops, device=device, events=columns.events,
                     float_times=columns.float_times, launch_tid=l_tid, launch_name=launch_code[l_host],
                     launch_names=[host_names[i] for i in order.tolist()],
                     waits=np.asarray(columns.waits, np.int64).reshape(-1, 3),
                     op_keys=[cost for _, cost in costs], op_names=[name for name, _ in costs], op_key=o_key,
                     op_tid=o_tid, op_ts=o_ts, op_dur=o_dur, shapes=columns.shapes,
                     comm_sizes=np.asarray(columns.comm, np.float64).reshape(-1, 3))


def _joined(blocks: list[tuple[np.ndarray, ...]], dtypes: tuple[type, ...]) -> list[np.ndarray]:
    """The blocks' columns end to end, of `dtypes`."""
    return [np.concatenate([block[k] for block in blocks]).astype(dtype, copy=False) if blocks else
            np.zeros(0, dtype) for k, dtype in enumerate(dtypes)]


def _cpu_work(top: list[np.ndarray], host_names: list[str]) -> tuple[list, list, list, list[str]]:
    """A CPU-only trace's work: the top-level CPU ops of each thread (ops nested in another are its parts)."""
    thread, start, length, name = top
    ts, dur, name_ids, names = [], [], [], {}
    for tid in dict.fromkeys(thread.tolist()):
        mine = np.flatnonzero(thread == tid)
        mine = mine[np.lexsort((-length[mine], start[mine]))]
        end = -np.inf
        for i in mine.tolist():
            if start[i] >= end:
                ts.append(float(start[i]))
                dur.append(float(length[i]))
                name_ids.append(names.setdefault(host_names[name[i]], len(names)))
                end = start[i] + length[i]
    return ts, dur, name_ids, list(names)
