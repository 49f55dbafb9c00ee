"""Read one Kineto / Chrome trace file (`.json` or `.json.gz`) into compact columns: GPU events, CPU runtime calls
(launches, event records, syncs), ProfilerStep ranges, CPU-op totals, and the FLOPs and bytes of every op whose
shapes were recorded. Nothing of the file's text is kept.

The events are decoded a block at a time into typed structs (`traces/events.py`), so memory grows with the columns
kept (numpy-sized: a few numbers per GPU event, launch and costed op), never with the file. Every failure to read
is one UsageError line naming the file.
"""

from __future__ import annotations

import gc
import gzip
import os
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.errors import UsageError
from stepscope.traces.events import Event, iter_events
from stepscope.traces.opcost import ATTENTION_OPS, ELEMENTWISE, GEMM_OPS, OpCost, op_cost
from stepscope.traces.read_dicts import CountingReader, Progress

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
STEPSCOPE_RANGE = "stepscope."
_CPU_OP_CATS = ("cpu_op", "user_annotation")
_NUMBER = (int, float)
_COSTED = frozenset(GEMM_OPS) | frozenset(ATTENTION_OPS) | frozenset(ELEMENTWISE)


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


DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Bool": 1}


@dataclass
class _Columns:
    """Columns filled while the events go by (array.array: 8 bytes a value, no Python objects)."""

    names: dict[str, int] = field(default_factory=dict)
    gpu: tuple[array, ...] = field(default_factory=lambda: (array("d"), array("d"), array("q"), array("q"),
                                                            array("q")))
    launch: tuple[array, ...] = field(default_factory=lambda: (array("q"), array("d"), array("d"), array("q"),
                                                               array("q")))
    launch_names: dict[str, int] = field(default_factory=dict)
    threads: dict[Any, int] = field(default_factory=dict)
    ops: tuple[array, ...] = field(default_factory=lambda: (array("q"), array("q"), array("d"), array("d")))
    op_keys: dict[tuple, int] = field(default_factory=dict)
    costs: list[tuple[str, OpCost]] = field(default_factory=list)
    """(op name, cost) of each key with a cost, in key order."""
    waits: array = field(default_factory=lambda: array("q"))
    comm: array = field(default_factory=lambda: array("d"))
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_marks: dict[int, float] = field(default_factory=dict)
    cpu_ops: dict[str, list[float]] = field(default_factory=dict)
    cpu_top: dict[int, list[tuple[float, float, str]]] = field(default_factory=dict)
    """CPU ops by thread (only while no GPU event was seen: the work of a CPU-only trace)."""
    stepscope_ranges: bool = False
    shapes: bool = False
    events: int = 0
    float_times: bool = False

    def add(self, events: list[Event]) -> None:
        names, (g_ts, g_dur, g_name, g_stream, g_corr) = self.names, self.gpu
        l_corr, l_ts, l_dur, l_tid, l_name = self.launch
        cpu_ops, floats, threads = self.cpu_ops, self.float_times, self.threads
        for e in events:
            if e.ph != "X":
                continue
            cat, args, dur, ts = e.cat, e.args, e.dur, e.ts
            if cat == "Trace" or dur is None or ts.__class__ not in _NUMBER or dur.__class__ not in _NUMBER:
                continue
            stream = args.stream if args is not None else None
            if stream is not None and (stream.__class__ is not int or not -2**63 <= stream < 2**63):
                stream = _int64(stream)
            # HTA's rule: an event is on the GPU when its stream is a number other than -1; Kineto puts
            # Event Sync / Context Sync (a host waiting, not GPU work) on stream -1
            if stream == -1:
                continue
            name = e.name
            if name.__class__ is not str:
                name = "" if name is None else str(name)
            if stream is not None:
                if not floats and (ts % 1 or dur % 1):
                    floats = True
                index = len(g_ts)
                g_ts.append(ts)
                g_dur.append(dur)
                g_name.append(names.setdefault(name, len(names)))
                g_stream.append(stream)
                g_corr.append(_int64(args.correlation, -1) if args.correlation is not None else -1)
                if args.wait_on_record is not None:
                    self.waits.extend((index, _int64(args.wait_on_stream, -1), _int64(args.wait_on_record, -1)))
                if args.in_nelems is not None:
                    self._comm(index, args)
                if self.cpu_top:
                    self.cpu_top.clear()  # a GPU trace: the CPU ops are not the work
            elif name.startswith("ProfilerStep#"):
                match = STEP_NAME.match(name)
                if match:
                    number = int(match.group(1))
                    self.step_marks[number] = max(float(ts), self.step_marks.get(number, -np.inf))
                    if cat == "user_annotation":
                        self.steps.append((number, float(ts), float(ts + dur)))
            elif cat in _CPU_OP_CATS:
                if name.startswith(STEPSCOPE_RANGE):
                    self.stepscope_ranges = True
                total = cpu_ops.get(name)
                if total is None:
                    cpu_ops[name] = [1, dur]
                else:
                    total[0] += 1
                    total[1] += dur
                if args is not None and args.dims is not None:
                    self.shapes = True
                    if name in _COSTED:
                        self._cost(name, args, e.tid, ts, dur)
                if cat == "cpu_op" and not g_ts:
                    self.cpu_top.setdefault(e.tid, []).append((float(ts), float(dur), name))
            elif cat in ("cuda_runtime", "cuda_driver") and args is not None and args.correlation is not None:
                l_corr.append(_int64(args.correlation, -1))
                l_ts.append(ts)
                l_dur.append(dur)
                l_tid.append(threads.setdefault(e.tid, len(threads)))
                l_name.append(self.launch_names.setdefault(name, len(self.launch_names)))
        self.events += len(events)
        self.float_times = floats

    def _comm(self, index: int, args: Any) -> None:
        nelems, group = _int64(args.in_nelems), _int64(args.group_size, 0)
        if nelems is not None and nelems >= 0:
            self.comm.extend((index, nelems * DTYPE_BYTES.get(str(args.dtype), 4), group or 0))

    def _cost(self, name: str, args: Any, tid: Any, ts: float, dur: float) -> None:
        key = (name, _frozen(args.dims), _frozen(args.types), _frozen(args.concrete))
        index = self.op_keys.get(key)
        if index is None:
            cost = op_cost(name, args.dims, args.types, args.concrete)
            index = self.op_keys[key] = len(self.costs) if cost is not None else -1
            if cost is not None:
                self.costs.append((name, cost))
        if index >= 0:
            key_col, tid_col, ts_col, dur_col = self.ops
            key_col.append(index)
            tid_col.append(self.threads.setdefault(tid, len(self.threads)))
            ts_col.append(ts)
            dur_col.append(dur)



def _frozen(value: Any) -> Any:
    """A hashable copy of nested lists (the dims, types and concrete inputs of an op)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _int64(value: Any, default: int | None = None) -> int | None:
    """`value` as a signed 64-bit integer (an unsigned 64-bit one wraps, as the C++ that wrote it meant: 2^64 − 1
    is −1), or `default` when it is not a number or does not fit."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if 2**63 <= number < 2**64:
        number -= 2**64
    return number if -2**63 <= number < 2**63 else default


def read_trace(path: str | os.PathLike, progress: Progress | None = None) -> RankTrace:
    """One trace file as a RankTrace; UsageError (one line) for a file that is not a complete trace."""
    path = Path(path)
    columns = _Columns()
    meta: dict[str, Any] = {}
    collecting = gc.isenabled()
    gc.disable()  # many small objects and no cycles: the cyclic collector would only rescan them
    try:
        with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
            source = CountingReader(raw, handle, progress)
            for events in iter_events(source, meta):
                columns.add(events)
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


def _finish(path: Path, meta: dict[str, Any], columns: _Columns) -> RankTrace:
    g_ts, g_dur, g_name, g_stream, g_corr = (_numpy(a) for a in columns.gpu)
    names = list(columns.names)
    device = "GPU"
    if not len(g_ts):
        if not columns.stepscope_ranges or not columns.cpu_top:
            raise UsageError(f"no GPU events in {path} (no kernels, copies or syncs on a GPU stream)")
        device = "CPU"
        g_ts, g_dur, g_name, names = _cpu_work(columns.cpu_top)
        g_stream = np.zeros(len(g_ts), np.int64)
        g_corr = np.full(len(g_ts), -1, np.int64)
    l_corr, l_ts, l_dur, l_tid, l_name = (_numpy(a) for a in columns.launch)
    o_key, o_tid, o_ts, o_dur = (_numpy(a) for a in columns.ops)
    costs = columns.costs
    return RankTrace(path=path, meta=meta, names=names, gpu_ts=np.asarray(g_ts, np.float64),
                     gpu_dur=np.asarray(g_dur, np.float64), gpu_name=np.asarray(g_name, np.int64),
                     gpu_stream=g_stream, gpu_corr=g_corr, launch_corr=l_corr, launch_ts=l_ts, launch_dur=l_dur,
                     steps=sorted(columns.steps, key=lambda s: s[1]), step_marks=columns.step_marks,
                     cpu_ops=columns.cpu_ops, device=device, events=columns.events,
                     float_times=columns.float_times, launch_tid=l_tid, launch_name=l_name,
                     launch_names=list(columns.launch_names),
                     waits=np.asarray(columns.waits, np.int64).reshape(-1, 3),
                     op_keys=[cost for _, cost in costs], op_names=[name for name, _ in costs], op_key=o_key,
                     op_tid=o_tid, op_ts=o_ts, op_dur=o_dur, shapes=columns.shapes,
                     comm_sizes=np.asarray(columns.comm, np.float64).reshape(-1, 3))


def _numpy(values: array) -> np.ndarray:
    return np.asarray(values, dtype=np.int64 if values.typecode == "q" else np.float64)


def _cpu_work(by_thread: dict[Any, list[tuple[float, float, str]]]) -> tuple[list, list, list, list[str]]:
    """A CPU-only trace's work: the top-level CPU ops of each thread (ops nested in another are its parts)."""
    ts, dur, name_ids, names = [], [], [], {}
    for ops in by_thread.values():
        end = -np.inf
        for start, length, name in sorted(ops, key=lambda op: (op[0], -op[1])):
            if start >= end:
                ts.append(start)
                dur.append(length)
                name_ids.append(names.setdefault(name, len(names)))
                end = start + length
    return ts, dur, name_ids, list(names)
