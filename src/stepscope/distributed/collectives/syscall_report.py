"""Views of `syscalls` records (`syscall_tally`), THAPI's layout: a header per backend and world size
(`gloo 2 ranks | 1 Hostnames | 4 Processes | 20 Threads`), then tables with sizes as rows and the backends side
by side as columns; flat rows (one per record) for csv / json. Every count is per collective call, summed over
the ranks and helper processes (the record's totals divided by its `iters`). Views only: the records are the data.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

FLAT_COLUMNS = ["backend", "op", "world_size", "size_bytes", "dtype", "mode", "in_place", "iters", "hostnames",
                "processes", "threads", "active_threads", "rank_tasks", "calls", "time_us", "send_calls",
                "send_bytes", "recv_calls", "recv_bytes", "copy_calls", "copy_bytes", "poll_calls", "poll_time_us",
                "sync_calls", "sync_time_us", "memory_calls", "memory_bytes", "thread_calls", "other_calls",
                "untraced_time_us", "traced_time_us", "overhead_x"]

TABLES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("host: system calls (all kinds) and the time spent in them", (("calls", "calls"), ("time_us", "time_us"))),
    ("network: socket send / receive calls, bytes sent (payload + headers) and copied between processes (CMA)",
     (("send_calls", "send"), ("recv_calls", "recv"), ("send_bytes", "sent_bytes"), ("copy_calls", "cma"),
      ("copy_bytes", "cma_bytes"))),
    ("polling and synchronisation: poll/epoll and futex/yield/sleep calls, and the time they waited",
     (("poll_calls", "poll"), ("sync_calls", "sync"), ("wait_us", "wait_us"))),
    ("memory and threads: mmap/munmap/brk/madvise/mprotect calls, bytes mapped, threads created",
     (("memory_calls", "mem"), ("memory_bytes", "mapped_bytes"), ("thread_calls", "clones"))),
    ("the tracer's overhead: time per collective call untraced (the command's own timed run) and under strace",
     (("untraced_time_us", "plain_us"), ("traced_time_us", "traced_us"), ("overhead_x", "x"))),
)
PER_CALL = {"calls", "time_us", "send_calls", "recv_calls", "send_bytes", "copy_calls", "copy_bytes", "poll_calls",
            "sync_calls", "wait_us", "memory_calls", "memory_bytes", "thread_calls"}
"""Metrics that are totals over the window (divided by iters in the tables); the others are per call already."""


def syscall_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `syscalls` records among `records` (comm's and innet bench's)."""
    return [r for r in records if r.get("kind") in ("comm", "innet-bench")
            and r.get("config", {}).get("record") == "syscalls"]


def _group(record: dict[str, Any]) -> str:
    return f"{record['config']['backend']}{record['config']['world_size']}"


def headers(records: Iterable[dict[str, Any]]) -> list[str]:
    """One line per backend and world size: hostnames, processes and threads alive during the timed calls (the
    most any size saw), with each rank process's own thread count from its /proc/self/task."""
    lines: OrderedDict[str, str] = OrderedDict()
    best: dict[str, dict[str, Any]] = {}
    for record in syscall_records(records):
        group, m = _group(record), record["metrics"]
        if group not in best or m["threads"] > best[group]["threads"]:
            best[group] = {**m, "backend": record["config"]["backend"], "world": record["config"]["world_size"]}
    for group, m in best.items():
        per_rank = m["rank_tasks"] / m["world"]
        lines[group] = (f"{m['backend'].upper()} {m['world']} ranks | {m['hostnames']} Hostnames | {m['processes']} "
                        f"Processes | {m['threads']} Threads ({per_rank:g} per rank process; programs: "
                        f"{', '.join(m['programs'])})")
    return list(lines.values())


def side_by_side(records: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(title, rows) per world size and table: one row per size (and op, mode, dtype, placement where they vary),
    `<backend><world>_<column>` per backend; one set of tables per world size keeps them readable."""
    chosen = syscall_records(records)
    worlds = sorted({r["config"]["world_size"] for r in chosen})
    return [(f"{title} | {world} ranks", rows) for world in worlds
            for title, rows in _tables([r for r in chosen if r["config"]["world_size"] == world])]


def _tables(chosen: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    tables = []
    for title, columns in TABLES:
        rows: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        for record in chosen:
            c, m = record["config"], record["metrics"]
            ident = {"op": c["op"], "size_bytes": c["size_bytes"], "mode": c.get("mode"), "dtype": c.get("dtype"),
                     "place": {True: "in", False: "out"}.get(c.get("in_place"))}
            row = rows.setdefault(tuple(ident.values()), dict(ident))
            values = {**m, "wait_us": m["poll_time_us"] + m["sync_time_us"]}
            for metric, column in columns:
                value = values.get(metric)
                if metric in PER_CALL and value is not None:
                    value = value / c["iters"]
                row[f"{_group(record)}_{column}"] = value
        ordered = sorted(rows.values(), key=lambda r: tuple(str(r[k]) if k != "size_bytes" else r[k] for k in
                                                           ("op", "mode", "dtype", "place", "size_bytes")))
        for name in ("op", "mode", "dtype", "place"):  # say what varies only
            if len({r[name] for r in ordered}) == 1:
                for r in ordered:
                    r.pop(name)
        tables.append((f"{title}; per collective call, all ranks", ordered))
    return tables


def flat_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per record: its point and every total (csv / json)."""
    return [{c: {**r["config"], **r["metrics"]}.get(c) for c in FLAT_COLUMNS} for r in syscall_records(records)]
