"""Read one Kineto / Chrome trace file (`.json` or `.json.gz`) into compact columns: GPU events, kernel launches,
ProfilerStep ranges, CPU-op totals. Nothing of the file's text is kept.

Small files are parsed whole by orjson (fast); files above `TraceConfig.stream_above_MiB` are parsed as a stream of
events by ijson, so memory grows with the number of kernels, not with the file. Every failure to read is one
UsageError line naming the file.
"""

from __future__ import annotations

import gc
import gzip
import os
import re
import struct
import zlib
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from stepscope.errors import UsageError

Progress = Callable[[int], None]
"""Told the number of compressed bytes read so far."""

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
STEPSCOPE_RANGE = "stepscope."
_CPU_OP_CATS = ("cpu_op", "user_annotation")


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


@dataclass
class _Columns:
    """Columns filled while the events stream by (array.array: 8 bytes a value, no Python objects)."""

    names: dict[str, int] = field(default_factory=dict)
    gpu: tuple[array, ...] = field(default_factory=lambda: (array("d"), array("d"), array("q"), array("q"),
                                                            array("q")))
    launch: tuple[array, ...] = field(default_factory=lambda: (array("q"), array("d"), array("d")))
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_marks: dict[int, float] = field(default_factory=dict)
    cpu_ops: dict[str, list[float]] = field(default_factory=dict)
    cpu_top: dict[int, list[tuple[float, float, str]]] = field(default_factory=dict)
    """CPU ops by thread (only while no GPU event was seen: the work of a CPU-only trace)."""
    stepscope_ranges: bool = False
    events: int = 0
    float_times: bool = False

    def add(self, events: Iterable[Any]) -> None:
        names, (g_ts, g_dur, g_name, g_stream, g_corr) = self.names, self.gpu
        l_corr, l_ts, l_dur = self.launch
        cpu_ops, count, floats = self.cpu_ops, 0, self.float_times
        for e in events:
            count += 1
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            cat, args = e.get("cat"), e.get("args")
            if cat == "Trace" or "dur" not in e:
                continue
            stream = _int64(args.get("stream")) if isinstance(args, dict) else None
            # HTA's rule: an event is on the GPU when its stream is a number other than -1; Kineto puts
            # Event Sync / Context Sync (a host waiting, not GPU work) on stream -1
            if stream == -1:
                continue
            name, ts, dur = e.get("name", ""), e["ts"], e["dur"]
            if name.__class__ is not str:
                name = "" if name is None else str(name)
            if stream is not None:
                if not floats and (ts % 1 or dur % 1):
                    floats = True
                g_ts.append(ts)
                g_dur.append(dur)
                g_name.append(names.setdefault(name, len(names)))
                g_stream.append(stream)
                g_corr.append(_int64(args.get("correlation", -1), -1))
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
                if cat == "cpu_op" and not g_ts:
                    self.cpu_top.setdefault(e.get("tid", 0), []).append((float(ts), float(dur), name))
            elif cat in ("cuda_runtime", "cuda_driver") and isinstance(args, dict) and "correlation" in args:
                l_corr.append(_int64(args["correlation"], -1))
                l_ts.append(ts)
                l_dur.append(dur)
        self.events += count
        self.float_times = floats


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


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def text_size(path: Path) -> int:
    """Bytes of JSON text in the file (a gzip file's footer holds its size modulo 4 GiB; a file that shrinks
    when unpacked beyond that is larger than the footer says, so the compressed size is the floor)."""
    size = path.stat().st_size
    if path.suffix != ".gz" or size < 4:
        return size
    with open(path, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        footer = struct.unpack("<I", handle.read(4))[0]
    return max(footer, size)


class _Counting:
    """A binary file that tells `progress` how many (compressed) bytes were read."""

    def __init__(self, raw: BinaryIO, inner: BinaryIO, progress: Progress | None) -> None:
        self.raw, self.inner, self.progress = raw, inner, progress

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        if self.progress is not None:
            self.progress(self.raw.tell())
        return data


def read_trace(path: str | os.PathLike, stream_above_MiB: float = 256.0, progress: Progress | None = None) -> RankTrace:
    """One trace file as a RankTrace; UsageError (one line) for a file that is not a complete trace."""
    path = Path(path)
    columns = _Columns()
    meta = read_events(path, columns, stream_above_MiB, progress)
    return _finish(path, meta, columns)


def read_events(path: str | os.PathLike, sink: Any, stream_above_MiB: float = 256.0,
                progress: Progress | None = None) -> dict[str, Any]:
    """Hand every event of a trace file to `sink.add(events)` (an iterable of event dicts; `sink.events` counts
    them), whole or streamed as `read_trace` does; returns the file's metadata (the top-level keys but the
    events). UsageError (one line) for a file that is not a complete trace."""
    path = Path(path)
    columns = sink
    collecting = gc.isenabled()
    # millions of small dicts and no cycles: the cyclic collector would only rescan them (about a third of the time)
    gc.disable()
    try:
        if text_size(path) > stream_above_MiB * 2**20:
            meta = _read_streaming(path, columns, progress)
        else:
            meta = _read_whole(path, columns, progress)
    except UsageError:
        raise
    except (OSError, EOFError, zlib.error, ValueError, TypeError, KeyError) as error:
        reason = "truncated or corrupt" if not isinstance(error, OSError) or "gzip" in str(error).lower() \
            else (error.strerror or str(error))
        raise UsageError(f"cannot read trace {path}: {reason} ({type(error).__name__})") from None
    finally:
        if collecting:
            gc.enable()
    return meta


def _read_whole(path: Path, columns: _Columns, progress: Progress | None) -> dict[str, Any]:
    import orjson

    with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
        data = orjson.loads(_Counting(raw, handle, progress).read())
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UsageError(f"not a PyTorch profiler trace: {path} (no traceEvents list)")
    columns.add(data.pop("traceEvents"))
    return data


def _read_streaming(path: Path, columns: _Columns, progress: Progress | None) -> dict[str, Any]:
    import ijson

    try:
        with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
            columns.add(ijson.items(_Counting(raw, handle, progress), "traceEvents.item", use_float=True))
        meta = _head_meta(path)
        if "distributedInfo" not in meta:  # written after the events: a second pass that builds only that value
            with _open(path) as handle:
                meta["distributedInfo"] = next(ijson.items(handle, "distributedInfo", use_float=True), None)
    except ijson.JSONError:
        raise ValueError("incomplete JSON") from None
    if columns.events == 0:
        raise UsageError(f"not a PyTorch profiler trace: {path} (no events in a traceEvents list)")
    return meta


HEAD_BYTES = 1 << 22
"""Kineto writes its metadata (distributedInfo, deviceProperties) before the events: the first 4 MiB hold it."""


def _head_meta(path: Path) -> dict[str, Any]:
    """The top-level keys before `traceEvents`, parsed from the head of the file (the events are not read)."""
    import orjson

    with _open(path) as handle:
        head = handle.read(HEAD_BYTES)
    index = head.find(b'"traceEvents"')
    if index < 0:
        return {}
    text = head[:index].rstrip().rstrip(b",")
    try:
        meta = orjson.loads(text + b"}") if text.strip() != b"{" else {}
    except orjson.JSONDecodeError:
        meta = {}
    return meta if isinstance(meta, dict) else {}


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
    l_corr, l_ts, l_dur = (_numpy(a) for a in columns.launch)
    return RankTrace(path=path, meta=meta, names=names, gpu_ts=np.asarray(g_ts, np.float64),
                     gpu_dur=np.asarray(g_dur, np.float64), gpu_name=np.asarray(g_name, np.int64),
                     gpu_stream=g_stream, gpu_corr=g_corr, launch_corr=l_corr, launch_ts=l_ts, launch_dur=l_dur,
                     steps=sorted(columns.steps, key=lambda s: s[1]), step_marks=columns.step_marks,
                     cpu_ops=columns.cpu_ops, device=device,
                     events=columns.events, float_times=columns.float_times)


def _numpy(values: array) -> np.ndarray:
    return np.asarray(values, dtype=np.int64 if values.typecode == "q" else np.float64)


def _cpu_work(by_thread: dict[int, list[tuple[float, float, str]]]) -> tuple[list, list, list, list[str]]:
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
