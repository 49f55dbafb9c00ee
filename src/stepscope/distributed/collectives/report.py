"""Rows for printing `comm` records: an nccl-tests-like table per backend, op, world, dtype and mode (one
line per size, out-of-place and in-place side by side; all_to_allv: one table per skew, with the
imbalance and the hottest receiver's rate), flat rows for csv/json/md, α–β fit rows, and one-line notes
for unsupported, oom and mismatching points. Views only: the records are the data.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from stepscope.distributed.collectives.alpha_beta import headline_time_us
from stepscope.distributed.collectives.ops import REDUCING_OPS

FLAT_COLUMNS = ["backend", "op", "world_size", "size_bytes", "requested_bytes", "count", "dtype", "mode", "in_place",
                "status", "time_us_max", "time_us_min", "time_us_mean", "algbw_GBps", "busbw_GBps", "wrong", "note"]
UNEVEN_COLUMNS = ["skew", "seed", "imbalance", "recv_bytes_max", "recv_max_GBps"]
"""all_to_allv's extra columns (after `wrong`), present when a record has a skew."""
FIT_COLUMNS = ["backend", "op", "world_size", "dtype", "mode", "in_place", "alpha_us", "beta_GBps", "residual_rms_pct",
               "residual_max_pct", "points", "size_min_bytes", "size_max_bytes"]
_PLACES = ((False, "out"), (True, "in"))


def _points(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "comm" and r.get("config", {}).get("record") == "point"]


def table_blocks(records: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(title, rows) per backend/op/world/dtype/mode (and reduction, when not all sum: imported nccl-tests
    `-o prod` logs); placements that never ran get no columns."""
    blocks: OrderedDict[tuple, list[dict[str, Any]]] = OrderedDict()
    for record in _points(records):
        c = record["config"]
        blocks.setdefault((c["backend"], c["op"], c["world_size"], c["dtype"], c["mode"], c.get("skew"), c.get("seed"),
                           c.get("redop")), []).append(record)
    named = {key[:-1] for key in blocks if key[-1] is not None}  # where "sum" must be said too
    out = []
    for (backend, op, world, dtype, mode, skew, seed, redop), members in blocks.items():
        title = f"{backend} {op} | {world} ranks | {dtype} | {mode}"
        if skew is not None:
            title += f" | skew {skew:g}" + (f" seed {seed}" if seed else "")
        if (backend, op, world, dtype, mode, skew, seed) in named:
            title += f" | {redop or 'sum'}"
        if op == "barrier":
            rows = [{"time_us_max": m["metrics"].get("time_us_max"), "time_us_min": m["metrics"].get("time_us_min"),
                     "time_us_mean": m["metrics"].get("time_us_mean"), "status": m["status"]} for m in members]
            out.append((title, rows))
            continue
        measured = {place for place, _ in _PLACES
                    if any(bool(m["config"].get("in_place")) == place and m["status"] in ("ok", "mismatch")
                           for m in members)}
        by_size: OrderedDict[int, dict[str, Any]] = OrderedDict()
        for m in members:
            c, metrics = m["config"], m.get("metrics", {})
            row = by_size.setdefault(c["size_bytes"], {"size_bytes": c["size_bytes"], "count": c.get("count")})
            if c.get("skew") is not None:  # all_to_allv: what the split did, the same in both placements
                row.setdefault("imbalance", None)
            place = bool(c.get("in_place"))
            if place not in measured:
                continue
            prefix = "in" if place else "out"
            good = m["status"] in ("ok", "mismatch")
            row[f"{prefix}_time_us"] = headline_time_us(metrics) if good else m["status"]
            row[f"{prefix}_algbw_GBps"] = metrics.get("algbw_GBps") if good else None
            row[f"{prefix}_busbw_GBps"] = metrics.get("busbw_GBps") if good else None
            row[f"{prefix}_wrong"] = metrics.get("wrong") if good else None
            if good and "imbalance" in metrics:
                row["imbalance"] = metrics["imbalance"]
                row[f"{prefix}_recv_max_GBps"] = metrics.get("recv_max_GBps")
        out.append((title, list(by_size.values())))
    return out


def units_note(records: Iterable[dict[str, Any]]) -> str:
    """What the table columns mean, printed once above the tables."""
    measured = any("time_us_max" in r.get("metrics", {}) for r in _points(records))
    stat = "max over ranks" if measured else "mean over ranks (as logged by nccl-tests)"
    note = (f"time_us: microseconds per call, {stat}; algbw = S / time, busbw = algbw x bus factor, "
            "in GB/s (1e9 B/s); wrong: elements that failed the check, summed over ranks")
    if any(r["config"].get("skew") is not None for r in _points(records)):
        note += ("\nall_to_allv: S = bytes each rank sends (the same on every rank), split by a Zipf popularity "
                 "with exponent `skew`; imbalance = most elements a rank receives / the mean; recv_max_GBps = "
                 "bytes that rank receives from the others / time")
    return note


def _with_redop(columns: list[str], configs: list[dict[str, Any]]) -> list[str]:
    """`columns` plus a redop column after dtype when some record reduces with something other than sum."""
    if not any(c.get("redop") for c in configs):
        return columns
    at = columns.index("dtype") + 1
    return columns[:at] + ["redop"] + columns[at:]


def _with_skew(columns: list[str], configs: list[dict[str, Any]]) -> list[str]:
    """`columns` plus all_to_allv's columns after `wrong` when some record has a skew."""
    if not any(c.get("skew") is not None for c in configs):
        return columns
    at = columns.index("wrong") + 1
    return columns[:at] + UNEVEN_COLUMNS + columns[at:]


def flat_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured point record (csv/json/md output)."""
    points = _points(records)
    configs = [r["config"] for r in points]
    columns = _with_skew(_with_redop(FLAT_COLUMNS, configs), configs)
    rows = []
    for record in points:
        row = {**record["config"], **record.get("metrics", {}), "status": record.get("status"),
               "note": record.get("note")}
        if "redop" in columns and row.get("redop") is None:
            row["redop"] = "sum" if row.get("op") in REDUCING_OPS else None
        rows.append({c: row.get(c) for c in columns})
    return rows


def fit_rows(fit_records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    fits = list(fit_records)
    columns = _with_redop(FIT_COLUMNS, [r["config"] for r in fits])
    if any(r["config"].get("skew") is not None for r in fits):  # all_to_allv: one fit per skew
        at = columns.index("in_place") + 1
        columns = columns[:at] + ["skew"] + columns[at:]
    rows = []
    for r in fits:
        row = {**r["config"], **r["metrics"]}
        if "redop" in columns and row.get("redop") is None:
            row["redop"] = "sum" if row.get("op") in REDUCING_OPS else None
        rows.append({c: row.get(c) for c in columns})
    return rows


def status_notes(records: Iterable[dict[str, Any]]) -> list[str]:
    """One line per distinct reason a point has no (trustworthy) timing."""
    notes: OrderedDict[str, None] = OrderedDict()
    for record in _points(records):
        if record.get("status") == "ok":
            continue
        c = record["config"]
        place = "" if c.get("in_place") is None else (" in-place" if c["in_place"] else " out-of-place")
        what = f"{c['backend']} {c['op']}{place} {c['dtype']}" + (f" {c['redop']}" if c.get("redop") else "")
        notes[f"{record['status']}: {what}: {record.get('note') or ''}".rstrip(": ")] = None
    return list(notes)
