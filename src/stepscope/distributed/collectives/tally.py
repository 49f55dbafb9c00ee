"""Per-backend tallies in the style of THAPI's iprof: three tables per backend and sweep point.

1. host API calls: name | time | % | calls | average | min | max
2. device activity: kernels and copies on the accelerator (empty on CPU: said so, not hidden)
3. memory traffic: name | bytes | % | calls | average | min | max

Sources: torch backends are read from `torch.profiler` (top-level host events such as
`c10d::allreduce_` and the backend's work event `gloo:all_reduce` / `nccl:all_reduce`, CUDA kernels
`ncclDevKernel_*`, allocations from profile_memory, host copies `aten::copy_`); mpi4py has no profiler
hook, so its calls are timed by wrappers (`MpiTally`). Each rank produces a raw tally (JSON-friendly
dict of per-call samples); the parent merges all ranks' raw tallies into the tables.

Byte counts of torch events are element counts from the recorded input shapes times the point's
element size (the profiler does not record dtypes), so they assume the point's dtype.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

HOST, DEVICE, MEMORY = "host", "device", "memory"
_WORK_PREFIXES = ("gloo:", "nccl:", "ccl:", "mpi:", "ucc:")


def empty_raw(device: str) -> dict[str, Any]:
    return {HOST: {}, DEVICE: {}, MEMORY: {}, "threads": 0, "hostname": socket.gethostname(), "device_type": device}


def torch_raw_tally(profiler: Any, itemsize: int, device: str) -> dict[str, Any]:
    """One rank's raw tally from a finished `torch.profiler.profile`."""
    from torch.autograd import DeviceType

    raw = empty_raw(device)
    host: dict[str, list[float]] = defaultdict(list)
    dev: dict[str, list[float]] = defaultdict(list)
    memory: dict[str, list[float]] = defaultdict(list)
    threads = set()
    for event in profiler.events():
        if not event.name.strip():  # unnamed bookkeeping events carry nothing to report
            continue
        duration_us = float(event.time_range.elapsed_us())
        if event.device_type != DeviceType.CPU:
            dev[event.name].append(duration_us)
            continue
        threads.add(event.thread)
        if event.cpu_parent is None:  # top-level calls only: nested aten ops would be counted twice
            host[event.name].append(duration_us)
        shapes = event.input_shapes or []
        if event.name.startswith(_WORK_PREFIXES) and shapes and shapes[0]:
            memory[f"{event.name} input"].append(float(_numel(shapes[0]) * itemsize))
        elif event.name == "aten::copy_" and shapes and shapes[0]:
            memory["aten::copy_ (host copy)"].append(float(_numel(shapes[0]) * itemsize))
        if event.cpu_memory_usage and event.cpu_memory_usage > 0:
            memory[f"{event.name} (host alloc)"].append(float(event.cpu_memory_usage))
        device_bytes = getattr(event, "device_memory_usage", 0) or 0
        if device_bytes > 0:
            memory[f"{event.name} (device alloc)"].append(float(device_bytes))
    raw.update({HOST: dict(host), DEVICE: dict(dev), MEMORY: dict(memory), "threads": len(threads)})
    return raw


def _numel(shape: Iterable[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


class MpiTally:
    """Timing wrappers for mpi4py calls (mpi4py has no profiler hook): time and bytes per call."""

    def __init__(self) -> None:
        self.raw = empty_raw("cpu")
        self.active = False

    def start(self) -> None:
        self.raw = empty_raw("cpu")
        self.active = True

    def stop(self) -> dict[str, Any]:
        self.active = False
        self.raw["threads"] = threading.active_count()
        return self.raw

    def call(self, name: str, fn: Any, *args: Any, send_bytes: int = 0, recv_bytes: int = 0) -> Any:
        """Run `fn(*args)`; while active, record its wall time under `name` and the bytes it names."""
        if not self.active:
            return fn(*args)
        start = time.perf_counter()
        result = fn(*args)
        self.raw[HOST].setdefault(name, []).append((time.perf_counter() - start) * 1e6)
        if send_bytes:
            self.raw[MEMORY].setdefault(f"{name} send", []).append(float(send_bytes))
        if recv_bytes:
            self.raw[MEMORY].setdefault(f"{name} recv", []).append(float(recv_bytes))
        return result


def merge(raws: list[dict[str, Any] | None]) -> dict[str, Any]:
    """All ranks' raw tallies as one: samples concatenated per name, hosts/processes/threads counted."""
    present = [r for r in raws if r]
    merged: dict[str, Any] = {HOST: defaultdict(list), DEVICE: defaultdict(list), MEMORY: defaultdict(list)}
    for raw in present:
        for table in (HOST, DEVICE, MEMORY):
            for name, samples in raw[table].items():
                merged[table][name].extend(samples)
    merged["hosts"] = len({r["hostname"] for r in present})
    merged["processes"] = len(present)
    merged["threads"] = sum(r["threads"] for r in present)
    merged["device_type"] = present[0]["device_type"] if present else "cpu"
    return merged


def table_rows(samples_by_name: dict[str, list[float]], unit: str) -> list[dict[str, Any]]:
    """iprof columns for one table, largest total first, with a Total row; `unit` is `us` or `bytes`."""
    totals = {name: sum(samples) for name, samples in samples_by_name.items() if samples}
    grand = sum(totals.values())
    value = "time_us" if unit == "us" else "bytes"
    rows = []
    for name in sorted(totals, key=totals.get, reverse=True):
        samples = samples_by_name[name]
        rows.append({"name": name, value: totals[name], f"{value.split('_')[0]}_pct": 100 * totals[name] / grand
                     if grand else 0.0, "calls": len(samples), f"avg_{unit}": totals[name] / len(samples),
                     f"min_{unit}": min(samples), f"max_{unit}": max(samples)})
    if rows:
        rows.append({"name": "Total", value: grand, f"{value.split('_')[0]}_pct": 100.0,
                     "calls": sum(len(samples_by_name[n]) for n in totals)})
    return rows


def tally_tables(merged: dict[str, Any], backend: str,
                 label: str) -> list[tuple[str, list[dict[str, Any]], str | None]]:
    """The three tables of one point: (title, rows, note shown when there are no rows)."""
    where = (f"{merged['hosts']} host(s) | {merged['processes']} process(es) | {merged['threads']} thread(s)")
    empty_device = (f"no device activity: CPU-only run ({backend} moves data with host threads)"
                    if merged["device_type"] == "cpu" else "no device activity was recorded")
    source = "timing wrappers" if backend == "mpi" else "torch.profiler"
    return [
        (f"{backend} host API calls | {where} | {label} ({source})", table_rows(merged[HOST], "us"), None),
        (f"{backend} device activity | {where} | {label}", table_rows(merged[DEVICE], "us"), empty_device),
        (f"{backend} memory traffic | {where} | {label}", table_rows(merged[MEMORY], "bytes"),
         "no memory traffic was recorded"),
    ]
