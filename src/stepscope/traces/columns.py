"""The columns of one trace file, filled a decoded block of events at a time: GPU events, CPU runtime calls, step
ranges, CPU-op totals and the costed ops, as numpy arrays (a few numbers per kept event, no Python object per
event once a block is done).

A block is sorted into columns by list comprehensions over its structs and numpy masks, not by a Python loop with
a branch per event: an event's kind comes from its category and stream, and everything said of a name (a
`ProfilerStep#N`, a costed op) is decided once per distinct name. What is kept, per event (Kineto's fields):
- a GPU event: a complete event (`ph` X, numeric `ts` and `dur`, category not `Trace`) whose `args.stream` is a
  number other than −1 (HTA's rule; Kineto puts Event Sync / Context Sync, a host waiting, on stream −1);
- a step: a complete host event named `ProfilerStep#N` (its latest start of any category marks step N; a
  `user_annotation` one is the step's CPU range);
- a CPU op: a complete host event of category `cpu_op` or `user_annotation` (calls and total time per name; with
  `Input Dims` and a cost rule, the op's cost, thread, start and length);
- a runtime call: a complete host event of category `cuda_runtime` or `cuda_driver` with a correlation id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.traces.events import Event, raw_value
from stepscope.traces.opcost import ATTENTION_OPS, ELEMENTWISE, GEMM_OPS, OpCost, op_cost

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
STEPSCOPE_RANGE = "stepscope."
_NUMBER = (int, float)
_BIG = 2**63
_COSTED = frozenset(GEMM_OPS) | frozenset(ATTENTION_OPS) | frozenset(ELEMENTWISE)
CPU_OP, RUNTIME = 1, 2
_HOST_KINDS = {"cpu_op": CPU_OP, "user_annotation": CPU_OP, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Bool": 1}


def int64(value: Any, default: int | None = None) -> int | None:
    """`value` as a signed 64-bit integer (an unsigned 64-bit one wraps, as the C++ that wrote it meant: 2^64 − 1
    is −1), or `default` when it is not a number or does not fit."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if 2**63 <= number < 2**64:
        number -= 2**64
    return number if -2**63 <= number < 2**63 else default


def _ints(values: list[Any], default: int) -> np.ndarray:
    """A column of int64 (`int64` of each value; None and what does not fit: `default`)."""
    if not [v for v in values if v.__class__ is not int]:
        try:
            return np.array(values, np.int64)
        except OverflowError:
            pass
    return np.array([default if v is None else int64(v, default) for v in values], np.int64)


def _text(names: list[Any]) -> list[str]:
    """Names as text (a missing one: empty)."""
    for i in [i for i, n in enumerate(names) if n.__class__ is not str]:
        names[i] = "" if names[i] is None else str(names[i])
    return names


def _given(raw: Any) -> bool:
    """A raw field the event has (not absent, not null)."""
    return len(raw) > 0 and bytes(raw) != b"null"


def _frozen(value: Any) -> Any:
    """A hashable copy of nested lists (the dims, types and concrete inputs of an op)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass
class _Names:
    """Distinct host event names, and what each says: step number, a costed op."""

    ids: dict[str, int] = field(default_factory=dict)
    step: list[int] = field(default_factory=list)
    """N of `ProfilerStep#N`, −1 for another `ProfilerStep#` name (neither step nor op), −2 for any other name."""
    costed: list[bool] = field(default_factory=list)

    def codes(self, names: list[str]) -> np.ndarray:
        ids, known = self.ids, len(self.ids)
        codes = np.array([ids.setdefault(n, len(ids)) for n in names], np.int64)
        for name in list(ids)[known:]:
            match = STEP_NAME.match(name)
            self.step.append(int(match.group(1)) if match else -1 if name.startswith("ProfilerStep#") else -2)
            self.costed.append(name in _COSTED)
        return codes


@dataclass
class Columns:
    """What `read_trace` keeps of a file, filled by `add` a block at a time and turned into a RankTrace at the
    end (`read.finish`)."""

    gpu_names: dict[str, int] = field(default_factory=dict)
    gpu: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: ts, dur, name, stream, correlation of its GPU events."""
    gpu_events: int = 0
    host_names: _Names = field(default_factory=_Names)
    launch: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: correlation, ts, dur, thread, host name of its runtime calls."""
    threads: dict[Any, int] = field(default_factory=dict)
    cpu_calls: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Calls and summed time of each host name as a CPU op."""
    ops: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: cost key, thread, ts, dur of its costed ops."""
    raw_keys: dict[tuple, int] = field(default_factory=dict)
    op_keys: dict[tuple, int] = field(default_factory=dict)
    costs: list[tuple[str, OpCost]] = field(default_factory=list)
    """(op name, cost) of each key with a cost, in key order."""
    waits: list[tuple[int, int, int]] = field(default_factory=list)
    comm: list[tuple[int, int, int]] = field(default_factory=list)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_marks: dict[int, float] = field(default_factory=dict)
    cpu_top: dict[Any, list[tuple[float, float, str]]] = field(default_factory=dict)
    """CPU ops by thread, while no GPU event was seen (the work of a CPU-only trace)."""
    shapes: bool = False
    events: int = 0
    float_times: bool = False

    def add(self, events: list[Event]) -> None:
        self.events += len(events)
        done = [e for e in events if e.ph == "X" and e.cat != "Trace" and e.dur is not None
                and e.ts.__class__ in _NUMBER and e.dur.__class__ in _NUMBER]
        if not done:
            return
        streams = [None if e.args is None else e.args.stream for e in done]
        odd = [i for i, s in enumerate(streams) if s is not None and (s.__class__ is not int or not -_BIG <= s < _BIG)]
        for i in odd:
            streams[i] = int64(streams[i])
        gpu = [e for e, s in zip(done, streams, strict=True) if s is not None and s != -1]
        if gpu:
            self._gpu(gpu)
        host = [e for e, s in zip(done, streams, strict=True) if s is None]
        if host:
            self._host(host)

    def _gpu(self, events: list[Event]) -> None:
        ts = np.array([e.ts for e in events], np.float64)
        dur = np.array([e.dur for e in events], np.float64)
        if not self.float_times and (np.any(ts % 1) or np.any(dur % 1)):
            self.float_times = True
        names = self.gpu_names
        name = np.array([names.setdefault(n, len(names)) for n in _text([e.name for e in events])], np.int64)
        args = [e.args for e in events]
        stream = _ints([a.stream for a in args], -1)
        corr = _ints([a.correlation for a in args], -1)
        first = self.gpu_events
        for i in [i for i, a in enumerate(args) if a.wait_on_record is not None]:
            self.waits.append((first + i, int64(args[i].wait_on_stream, -1), int64(args[i].wait_on_record, -1)))
        for i in [i for i, a in enumerate(args) if a.in_nelems is not None]:
            nelems, group = int64(args[i].in_nelems), int64(args[i].group_size, 0)
            if nelems is not None and nelems >= 0:
                self.comm.append((first + i, nelems * DTYPE_BYTES.get(str(args[i].dtype), 4), group or 0))
        self.gpu.append((ts, dur, name, stream, corr))
        self.gpu_events += len(events)
        self.cpu_top.clear()  # a GPU trace: the CPU ops are not the work

    def _host(self, events: list[Event]) -> None:
        names = _text([e.name for e in events])
        code = self.host_names.codes(names)
        step = np.array(self.host_names.step, np.int64)[code]
        kind = np.array([_HOST_KINDS.get(e.cat, 0) if e.cat.__class__ is str else 0 for e in events],
                        np.int64)
        kind[step >= -1] = 0  # `ProfilerStep#` names are steps, never ops or calls
        ts = np.array([e.ts for e in events], np.float64)
        dur = np.array([e.dur for e in events], np.float64)
        for i in np.flatnonzero(step >= 0).tolist():
            number = int(step[i])
            self.step_marks[number] = max(float(ts[i]), self.step_marks.get(number, -np.inf))
            if events[i].cat == "user_annotation":
                self.steps.append((number, float(ts[i]), float(ts[i] + dur[i])))
        ops = np.flatnonzero(kind == CPU_OP)
        if len(ops):
            self._cpu_ops(events, names, code, ops, ts, dur)
        calls = [i for i in np.flatnonzero(kind == RUNTIME).tolist()
                 if events[i].args is not None and events[i].args.correlation is not None]
        if calls:
            threads = self.threads
            self.launch.append((_ints([events[i].args.correlation for i in calls], -1), ts[calls], dur[calls],
                                np.array([threads.setdefault(events[i].tid, len(threads)) for i in calls], np.int64),
                                code[calls]))

    def _cpu_ops(self, events: list[Event], names: list[str], code: np.ndarray, ops: np.ndarray, ts: np.ndarray,
                 dur: np.ndarray) -> None:
        size = len(self.host_names.ids)
        self.cpu_calls = np.pad(self.cpu_calls, (0, size - len(self.cpu_calls)))
        self.cpu_time = np.pad(self.cpu_time, (0, size - len(self.cpu_time)))
        self.cpu_calls += np.bincount(code[ops], minlength=size)
        self.cpu_time += np.bincount(code[ops], weights=dur[ops], minlength=size)
        shaped = [i for i in ops.tolist() if events[i].args is not None and _given(events[i].args.dims)]
        if shaped:
            self.shapes = True
            costed = self.host_names.costed
            self._costs([i for i in shaped if costed[code[i]]], events, names, ts, dur)
        if not self.gpu_events:
            for i in ops.tolist():
                if events[i].cat == "cpu_op":
                    self.cpu_top.setdefault(events[i].tid, []).append((float(ts[i]), float(dur[i]), names[i]))

    def _costs(self, ops: list[int], events: list[Event], names: list[str], ts: np.ndarray, dur: np.ndarray) -> None:
        keys = []
        for i in ops:
            args = events[i].args
            raw = (names[i], bytes(args.dims), bytes(args.types), bytes(args.concrete))
            index = self.raw_keys.get(raw)
            if index is None:
                index = self.raw_keys[raw] = self._key(names[i], args)
            keys.append(index)
        kept = [k for k, index in enumerate(keys) if index >= 0]
        if kept:
            rows = [ops[k] for k in kept]
            threads = self.threads
            self.ops.append((np.array([keys[k] for k in kept], np.int64),
                             np.array([threads.setdefault(events[i].tid, len(threads)) for i in rows], np.int64),
                             ts[rows], dur[rows]))

    def _key(self, name: str, args: Any) -> int:
        """The index of an op's (name, dims, types, concrete inputs) among the costed ones (−1: no cost); the same
        values written differently are one key."""
        dims, types, concrete = raw_value(args.dims), raw_value(args.types), raw_value(args.concrete)
        key = (name, _frozen(dims), _frozen(types), _frozen(concrete))
        index = self.op_keys.get(key)
        if index is None:
            cost = op_cost(name, dims, types, concrete)
            index = self.op_keys[key] = len(self.costs) if cost is not None else -1
            if cost is not None:
                self.costs.append((name, cost))
        return index
