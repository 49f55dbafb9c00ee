"""THAPI's view of a GPU run from its PyTorch profiler traces: per trace file (one rank), the hostnames,
processes and threads, and three tables — host API calls (the CUDA runtime and driver calls), device activity
(kernels; NCCL kernels under their own names, the others by stepscope's kernel category) and memory operations
(memcpy / memset by direction: bytes and calls) — plus the collectives by message size (NCCL kernels carry
their `In msg nelems` and `dtype`; older traces only give the CPU-side `nccl:*` op's `Input Dims`).

    outcome = run_trace_tally(TraceConfig(paths=("rank0.json.gz", "rank1.json.gz")), out="stepscope-results")

Records: one `trace-tally` record per file (`<out>/trace-tally.jsonl`), config {path, rank}, metrics the
counts and every table (name -> [calls, time_us] or [calls, bytes]). Nothing is written until every file is read.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.traces.config import TraceConfig
from stepscope.traces.kinds import _SNAKE, core_name, kernel_category
from stepscope.traces.read_dicts import read_events

DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
               "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1}
_NCCL = re.compile(r"^nccl", re.IGNORECASE)
_HOST_CATS = ("cuda_runtime", "cuda_driver")
_MEMORY_CATS = ("gpu_memcpy", "gpu_memset")


@dataclass
class FileTally:
    """One trace file's tables."""

    path: Path
    rank: int | None = None
    host: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    """CUDA runtime/driver call -> [calls, µs]."""
    device: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    """`nccl: <kernel>` or `<category> kernels` -> [calls, µs]."""
    memory: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0, 0.0]))
    """Memcpy/Memset kind -> [calls, bytes, µs]."""
    collectives: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    """(collective, message bytes) -> [calls, µs] (device time of the kernels, or host time of the CPU op)."""
    collective_source: str = "kernels"
    hostnames: set[str] = field(default_factory=set)
    threads: set[tuple[Any, Any]] = field(default_factory=set)
    events: int = 0
    _cpu_collectives: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))

    def add(self, events: Any) -> None:
        for e in events:
            self.events += 1
            if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
                continue
            cat, name, args, dur = e.get("cat"), e.get("name", ""), e.get("args") or {}, float(e["dur"])
            if cat in _HOST_CATS:
                _bump(self.host[name], dur)
            elif cat == "kernel":
                label = f"nccl: {core_name(name)}" if _NCCL.match(name) else f"{kernel_category(name)} kernels"
                _bump(self.device[label], dur)
                size = _message_bytes(args.get("In msg nelems"), args.get("dtype"))
                if _NCCL.match(name) and size is not None:
                    _bump(self.collectives[(_collective(args.get("Collective name")), size)], dur)
            elif cat in _MEMORY_CATS:
                slot = self.memory[name]
                slot[0] += 1
                slot[1] += float(args.get("bytes", 0) or 0)
                slot[2] += dur
            elif cat in ("cpu_op", "user_annotation") and name.startswith("nccl:"):
                dims, types = args.get("Input Dims"), args.get("Input type")
                if dims and types and isinstance(dims[0], list) and dims[0]:
                    numel = 1
                    for d in dims[0]:
                        numel *= int(d)
                    size = _message_bytes(numel, types[0])
                    if size is not None:
                        _bump(self._cpu_collectives[(_collective(name.removeprefix("nccl:")), size)], dur)
            if cat in ("cpu_op", "user_annotation", *_HOST_CATS, "python_function"):
                self.threads.add((e.get("pid"), e.get("tid")))

    def finish(self, meta: dict[str, Any]) -> None:
        info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
        self.rank = info.get("rank")
        host = meta.get("hostname") or meta.get("host_name")
        if host:
            self.hostnames.add(str(host))
        if not self.collectives and self._cpu_collectives:  # sizes only on the CPU side: host time per size
            self.collectives, self.collective_source = self._cpu_collectives, "CPU nccl:* ops"

    @property
    def processes(self) -> int:
        return len({pid for pid, _ in self.threads})

    def record(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(config, metrics) of this file's `trace-tally` record."""
        return ({"path": str(self.path), "rank": self.rank},
                {"hostnames": len(self.hostnames) or None, "processes": self.processes, "threads": len(self.threads),
                 "host": {k: v for k, v in self.host.items()}, "device": {k: v for k, v in self.device.items()},
                 "memory": {k: v for k, v in self.memory.items()},
                 "collectives": [[op, size, *v] for (op, size), v in sorted(self.collectives.items())],
                 "collective_source": self.collective_source})


def _bump(slot: list[float], dur: float) -> None:
    slot[0] += 1
    slot[1] += dur


def _collective(name: Any) -> str:
    """`allreduce` (kernel args) and `all_reduce` (CPU op) are one collective: stepscope's snake_case name."""
    text = str(name or "?")
    return _SNAKE.get(text.lower().replace("_", ""), text)


def _message_bytes(numel: Any, dtype: Any) -> int | None:
    size = DTYPE_BYTES.get(str(dtype).lower()) if dtype is not None else None
    try:
        return int(numel) * size if size is not None and numel is not None else None
    except (TypeError, ValueError):
        return None


@dataclass
class TallyOutcome:
    """The files tallied and where their records went."""

    files: list[FileTally]
    path: Path | None = None

    def records(self) -> list[dict[str, Any]]:
        """Each file's `trace-tally` record (as appended to `path`, without the environment)."""
        from stepscope.results.store import make_record

        return [make_record("trace-tally", *tally.record()) for tally in self.files]


def run_trace_tally(config: TraceConfig, out: str | os.PathLike | None = None) -> TallyOutcome:
    """Tally every trace of `config.paths` and append one `trace-tally` record per file to `<out>`."""
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.traces.run import trace_files

    files = trace_files(config.paths)
    store = RecordStore(out, "trace-tally").check_writable() if out is not None else None
    tallies = []
    for path in files:
        tally = FileTally(path)
        tally.finish(read_events(path, tally, config.stream_above_MiB))
        if not (tally.threads or tally.device or tally.host):
            raise UsageError(f"{path}: no profiler events to tally (is it a PyTorch profiler trace?)")
        tallies.append(tally)
    outcome = TallyOutcome(tallies)
    if store is not None:
        env = base_environment()
        for tally in tallies:
            record_config, metrics = tally.record()
            store.append(make_record("trace-tally", record_config, metrics, env=env))
        outcome.path = store.path
    return outcome
