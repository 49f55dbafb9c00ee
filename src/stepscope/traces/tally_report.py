"""Views of `trace-tally` records (`traces.tally`): a header per trace file (`NCCL rank 0 | - Hostnames | 1
Processes | 3 Threads`), then THAPI's tables with the files side by side as columns — host API calls, device
activity, memory operations (rows: names, largest first, the `top` of them and a Total) and the collectives by
message size (rows: sizes); flat rows for csv / json."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _label(record: dict[str, Any], index: int, ranks_distinct: bool) -> str:
    rank = record["config"].get("rank")
    return f"r{rank}" if ranks_distinct and rank is not None else f"f{index}"


def _labels(records: list[dict[str, Any]]) -> list[str]:
    ranks = [r["config"].get("rank") for r in records]
    distinct = None not in ranks and len(set(ranks)) == len(ranks)
    return [_label(r, i, distinct) for i, r in enumerate(records)]


def headers(records: list[dict[str, Any]], backend: str = "NCCL") -> list[str]:
    """One line per file: what it is and its hostnames (a Kineto trace does not name its host), processes and
    threads (CPU-side pids and tids that recorded events)."""
    lines = []
    for label, record in zip(_labels(records), records, strict=True):
        m = record["metrics"]
        hosts = m["hostnames"] if m.get("hostnames") else "-"
        lines.append(f"{label} = {Path(record['config']['path']).name}: {backend} rank {record['config'].get('rank')}"
                     f" | {hosts} Hostnames | {m['processes']} Processes | {m['threads']} Threads")
    return lines


def _table(records: list[dict[str, Any]], field: str, value: str, index: int, top: int) -> list[dict[str, Any]]:
    """Rows by name (largest total of `value` first, `top` of them, then a Total row), files side by side."""
    labels = _labels(records)
    totals: dict[str, float] = {}
    for record in records:
        for name, slot in record["metrics"][field].items():
            totals[name] = totals.get(name, 0.0) + slot[index]
    names = sorted(totals, key=totals.get, reverse=True)
    rows = []
    for name in [*names[:top], "Total"]:
        row: dict[str, Any] = {"name": name if name != "Total" or len(names) <= top else
                               f"Total ({len(names)} names)"}
        for label, record in zip(labels, records, strict=True):
            table = record["metrics"][field]
            slots = table.values() if name == "Total" else ([table[name]] if name in table else [])
            row[f"{label}_calls"] = int(sum(s[0] for s in slots)) if slots else None
            row[f"{label}_{value}"] = sum(s[index] for s in slots) if slots else None
        rows.append(row)
    return rows if names else []


def tables(records: Iterable[dict[str, Any]], top: int = 10) -> list[tuple[str, list[dict[str, Any]]]]:
    """(title, rows) of the four tables."""
    chosen = [r for r in records if r.get("kind") == "trace-tally"]
    labels = _labels(chosen)
    sizes: dict[tuple[str, int], dict[str, Any]] = {}
    for label, record in zip(labels, chosen, strict=True):
        for op, size, calls, time_us in record["metrics"]["collectives"]:
            row = sizes.setdefault((op, size), {"collective": op, "size_bytes": size})
            row[f"{label}_calls"], row[f"{label}_time_us"] = calls, time_us
    sources = sorted({r["metrics"]["collective_source"] for r in chosen})
    return [
        ("host: CUDA runtime and driver API calls (time in µs)", _table(chosen, "host", "time_us", 1, top)),
        ("device: kernels, NCCL kernels by name, the others by category (time in µs)",
         _table(chosen, "device", "time_us", 1, top)),
        ("memory: memcpy / memset operations (bytes)", _table(chosen, "memory", "bytes", 1, top)),
        (f"collectives by message size (time in µs; from {' and '.join(sources)})",
         sorted(sizes.values(), key=lambda r: (r["collective"], r["size_bytes"]))),
    ]


def flat_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per file, table and name (csv / json)."""
    rows = []
    for record in records:
        if record.get("kind") != "trace-tally":
            continue
        c, m = record["config"], record["metrics"]
        base = {"path": c["path"], "rank": c.get("rank"), "processes": m["processes"], "threads": m["threads"]}
        for table, value in (("host", "time_us"), ("device", "time_us"), ("memory", "bytes")):
            for name, slot in m[table].items():
                rows.append({**base, "table": table, "name": name, "size_bytes": None, "calls": int(slot[0]),
                             "time_us": slot[1] if value == "time_us" else slot[2], "bytes": slot[1]
                             if value == "bytes" else None})
        for op, size, calls, time_us in m["collectives"]:
            rows.append({**base, "table": "collectives", "name": op, "size_bytes": size, "calls": calls,
                         "time_us": time_us, "bytes": None})
    return rows
