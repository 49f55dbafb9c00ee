"""The columns of one trace file: its blocks (`traces/block.py`) merged in file order, their own tables of names,
threads and op keys mapped onto the file's. `read_trace` turns them into a RankTrace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.traces.block import Block
from stepscope.traces.opcost import OpCost


def _mapped(table: dict[Any, int], values: list[Any]) -> np.ndarray:
    """Indices of `values` in `table`, new ones appended (an int64 array, usable to remap a block's indices)."""
    return np.array([table.setdefault(v, len(table)) for v in values], np.int64)


@dataclass
class Columns:
    """What `read_trace` keeps of a file, merged a block at a time."""

    gpu_names: dict[str, int] = field(default_factory=dict)
    gpu: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: ts, dur, name, stream, correlation of its GPU events."""
    gpu_events: int = 0
    host_names: dict[str, int] = field(default_factory=dict)
    launch: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: correlation, ts, dur, thread, host name of its runtime calls."""
    threads: dict[Any, int] = field(default_factory=dict)
    cpu_calls: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Calls and summed time of each host name as a CPU op."""
    ops: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Per block: cost key, thread, ts, dur of its costed ops."""
    op_keys: dict[tuple, int] = field(default_factory=dict)
    costs: list[tuple[str, OpCost]] = field(default_factory=list)
    """(op name, cost) of each key with a cost, in key order."""
    waits: list[tuple[int, int, int]] = field(default_factory=list)
    comm: list[tuple[int, int, int]] = field(default_factory=list)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    step_marks: dict[int, float] = field(default_factory=dict)
    cpu_top: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """thread, ts, dur, host name of `cpu_op` events while no GPU event was seen (a CPU-only trace's work)."""
    shapes: bool = False
    events: int = 0
    float_times: bool = False

    def merge(self, block: Block) -> None:
        """Append a block (the next in the file)."""
        self.events += block.events
        self.shapes |= block.shapes
        self.steps += block.steps
        for number, start in block.step_marks.items():
            self.step_marks[number] = max(start, self.step_marks.get(number, -np.inf))
        if block.gpu:
            ts, dur, name, stream, corr = block.gpu
            self.gpu.append((ts, dur, _mapped(self.gpu_names, block.gpu_names)[name], stream, corr))
            first = self.gpu_events
            self.waits += [(first + i, stream, record) for i, stream, record in block.waits]
            self.comm += [(first + i, size, group) for i, size, group in block.comm]
            self.gpu_events += len(ts)
            self.float_times |= block.float_times
            self.cpu_top.clear()  # a GPU trace: the CPU ops are not the work
        host = _mapped(self.host_names, block.host_names)
        threads = _mapped(self.threads, block.threads)
        if len(block.cpu_calls):
            size = len(self.host_names)
            self.cpu_calls = np.pad(self.cpu_calls, (0, size - len(self.cpu_calls)))
            self.cpu_time = np.pad(self.cpu_time, (0, size - len(self.cpu_time)))
            self.cpu_calls[host] += block.cpu_calls
            self.cpu_time[host] += block.cpu_time
        if block.launch:
            corr, ts, dur, thread, name = block.launch
            self.launch.append((corr, ts, dur, threads[thread], host[name]))
        if block.ops:
            keys = np.array([self._key(key, name, cost) for key, name, cost in block.op_keys], np.int64)
            key, thread, ts, dur = block.ops
            kept = keys[key] >= 0
            self.ops.append((keys[key][kept], threads[thread][kept], ts[kept], dur[kept]))
        if block.cpu_top and not self.gpu_events:
            thread, ts, dur, name = block.cpu_top
            self.cpu_top.append((threads[thread], ts, dur, host[name]))

    def _key(self, key: tuple, name: str, cost: OpCost | None) -> int:
        """The file's index of an op key among the costed ones (−1: no cost)."""
        index = self.op_keys.get(key)
        if index is None:
            index = self.op_keys[key] = len(self.costs) if cost is not None else -1
            if cost is not None:
                self.costs.append((name, cost))
        return index
