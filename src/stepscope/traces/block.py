"""What one decoded block of trace events says, as numpy columns with the block's own tables of names, threads and
op shapes: a `Block`, built by `read_block` (in this process, or in a worker for a large file) and merged into the
file's columns by `traces/columns.py`.

A block is sorted into columns by list comprehensions over its structs and numpy masks, not by a Python loop with
a branch per event: an event's kind comes from its category and stream, and everything said of a name (a
`ProfilerStep#N`, a costed op) is decided once per distinct name. What is kept, per event (Kineto's fields):
- a GPU event: a complete event (`ph` X, numeric `ts` and `dur`, category not `Trace`) whose `args.stream` is a
  number other than −1 (HTA's rule; Kineto puts Event Sync / Context Sync, a host waiting, on stream −1);
- a step: a complete host event (no stream) named `ProfilerStep#N` (its latest start of any category marks step
  N; a `user_annotation` one is the step's CPU range);
- a CPU op: a complete host event of category `cpu_op` or `user_annotation` (calls and total time per name; with
  `Input Dims` and a cost rule, the op's cost, thread, start and length; in a block without GPU events, `cpu_op`
  events are also kept as the work of a CPU-only trace);
- a runtime call: a complete host event of category `cuda_runtime` or `cuda_driver` with a correlation id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.traces.events import Event, int64, raw_value
from stepscope.traces.opcost import ATTENTION_OPS, ELEMENTWISE, GEMM_OPS, OpCost, op_cost

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_COSTED = frozenset(GEMM_OPS) | frozenset(ATTENTION_OPS) | frozenset(ELEMENTWISE)
CPU_OP, RUNTIME = 1, 2
_HOST_KINDS = {"cpu_op": CPU_OP, "user_annotation": CPU_OP, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Bool": 1}


@dataclass
class Block:
    """One block's columns; names, threads and op keys are indices into the block's own lists."""

    events: int = 0
    gpu: tuple[np.ndarray, ...] = ()
    """ts, dur, name, stream, correlation of the GPU events (empty: none)."""
    gpu_names: list[str] = field(default_factory=list)
    float_times: bool = False
    waits: list[tuple[int, int, int]] = field(default_factory=list)
    """(GPU event, stream waited on, correlation of the record waited for) of each `Stream Wait Event`."""
    comm: list[tuple[int, int, int]] = field(default_factory=list)
    """(GPU event, bytes in, group size) of communication kernels stating their message size."""
    host_names: list[str] = field(default_factory=list)
    cpu_calls: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Calls and summed time of each host name as a CPU op."""
    launch: tuple[np.ndarray, ...] = ()
    """correlation, ts, dur, thread, host name of the runtime calls (empty: none)."""
    threads: list[Any] = field(default_factory=list)
    ops: tuple[np.ndarray, ...] = ()
    """op key, thread, ts, dur of the costed ops (empty: none)."""
    op_keys: list[tuple[tuple, str, OpCost | None]] = field(default_factory=list)
    """(op name, dims, types, concrete inputs) as a hashable key, the op's name and its cost (None: none)."""
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_marks: dict[int, float] = field(default_factory=dict)
    cpu_top: tuple[np.ndarray, ...] = ()
    """thread, ts, dur, host name of the `cpu_op` events of a block without GPU events (empty: none)."""
    shapes: bool = False


def read_block(events: list[Event]) -> Block:
    """The columns of one block of events (see the module docstring)."""
    block = Block(events=len(events))
    done = [e for e in events if e.ph == "X" and e.dur is not None and e.cat != "Trace"]
    streams = [None if e.args is None else e.args.stream for e in done]
    gpu = [e for e, s in zip(done, streams, strict=True) if s is not None and s != -1]
    if gpu:
        _gpu(block, gpu)
    host = [e for e, s in zip(done, streams, strict=True) if s is None]
    if host:
        _host(block, host)
    return block


def _gpu(block: Block, events: list[Event]) -> None:
    ts = np.fromiter([e.ts for e in events], np.float64, len(events))
    dur = np.fromiter([e.dur for e in events], np.float64, len(events))
    block.float_times = bool(np.any(ts % 1) or np.any(dur % 1))
    ids: dict[str, int] = {}
    name = np.fromiter([ids.setdefault(e.name, len(ids)) for e in events], np.int64, len(events))
    block.gpu_names = list(ids)
    args = [e.args for e in events]
    for i in [i for i, a in enumerate(args) if a.wait_on_record is not None]:
        block.waits.append((i, int64(args[i].wait_on_stream, -1), int64(args[i].wait_on_record, -1)))
    for i in [i for i, a in enumerate(args) if a.in_nelems is not None]:
        nelems, group = int64(args[i].in_nelems), int64(args[i].group_size, 0)
        if nelems is not None and nelems >= 0:
            block.comm.append((i, nelems * DTYPE_BYTES.get(str(args[i].dtype), 4), group or 0))
    block.gpu = (ts, dur, name, np.fromiter([a.stream for a in args], np.int64, len(args)),
                 _ints([a.correlation for a in args]))


def _host(block: Block, events: list[Event]) -> None:
    names = [e.name for e in events]
    ids: dict[str, int] = {}
    code = np.fromiter([ids.setdefault(n, len(ids)) for n in names], np.int64, len(names))
    block.host_names = list(ids)
    step = np.array([_step_number(n) for n in block.host_names], np.int64)[code]
    kind = np.fromiter([_HOST_KINDS.get(e.cat, 0) for e in events], np.int64, len(events))
    kind[step >= -1] = 0  # `ProfilerStep#` names are steps, never ops or calls
    ts = np.fromiter([e.ts for e in events], np.float64, len(events))
    dur = np.fromiter([e.dur for e in events], np.float64, len(events))
    for i in np.flatnonzero(step >= 0).tolist():
        number = int(step[i])
        block.step_marks[number] = max(float(ts[i]), block.step_marks.get(number, -np.inf))
        if events[i].cat == "user_annotation":
            block.steps.append((number, float(ts[i]), float(ts[i] + dur[i])))
    threads: dict[Any, int] = {}
    ops = np.flatnonzero(kind == CPU_OP)
    if len(ops):
        block.cpu_calls = np.bincount(code[ops], minlength=len(ids)).astype(np.float64)
        block.cpu_time = np.bincount(code[ops], weights=dur[ops], minlength=len(ids))
        _costs(block, events, names, code, ops.tolist(), ts, dur, threads)
        if not block.gpu:
            top = [i for i in ops.tolist() if events[i].cat == "cpu_op"]
            block.cpu_top = (np.array([threads.setdefault(events[i].tid, len(threads)) for i in top], np.int64),
                             ts[top], dur[top], code[top])
    calls = [i for i in np.flatnonzero(kind == RUNTIME).tolist()
             if events[i].args is not None and events[i].args.correlation is not None]
    if calls:
        block.launch = (_ints([events[i].args.correlation for i in calls]), ts[calls], dur[calls],
                        np.array([threads.setdefault(events[i].tid, len(threads)) for i in calls], np.int64),
                        code[calls])
    block.threads = list(threads)


def _costs(block: Block, events: list[Event], names: list[str], code: np.ndarray, ops: list[int], ts: np.ndarray,
           dur: np.ndarray, threads: dict[Any, int]) -> None:
    """The costed ops: those with shapes whose name has a cost rule, by (name, dims, types, concrete inputs)."""
    shaped = [i for i in ops if events[i].args is not None and _given(events[i].args.dims)]
    if not shaped:
        return
    block.shapes = True
    costed = [names[i] in _COSTED for i in shaped]
    raw_index: dict[tuple, int] = {}
    keys: dict[tuple, int] = {}
    rows, indices = [], []
    for i, yes in zip(shaped, costed, strict=True):
        if not yes:
            continue
        args = events[i].args
        raw = (names[i], bytes(args.dims), bytes(args.types), bytes(args.concrete))
        index = raw_index.get(raw)
        if index is None:  # decoded once per distinct raw text; the same values written differently are one key
            dims, types, concrete = raw_value(args.dims), raw_value(args.types), raw_value(args.concrete)
            key = (names[i], _frozen(dims), _frozen(types), _frozen(concrete))
            index = keys.get(key)
            if index is None:
                index = keys[key] = len(block.op_keys)
                block.op_keys.append((key, names[i], op_cost(names[i], dims, types, concrete)))
            raw_index[raw] = index
        rows.append(i)
        indices.append(index)
    if rows:
        block.ops = (np.array(indices, np.int64),
                     np.array([threads.setdefault(events[i].tid, len(threads)) for i in rows], np.int64),
                     ts[rows], dur[rows])


def _step_number(name: str) -> int:
    """N of `ProfilerStep#N`; −1 for another `ProfilerStep#` name (neither step, op nor call); −2 otherwise."""
    match = STEP_NAME.match(name)
    return int(match.group(1)) if match else -1 if name.startswith("ProfilerStep#") else -2


def _ints(values: list[int | None]) -> np.ndarray:
    """A column of int64, None as −1."""
    try:
        return np.array(values, np.int64)
    except TypeError:  # some None
        return np.array([-1 if v is None else v for v in values], np.int64)


def _given(raw: Any) -> bool:
    """A raw field the event has (not absent, not null)."""
    return len(raw) > 0 and bytes(raw) != b"null"


def _frozen(value: Any) -> Any:
    """A hashable copy of nested lists (the dims, types and concrete inputs of an op)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
