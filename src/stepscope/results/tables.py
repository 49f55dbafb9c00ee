"""Tables of one measured point (profile, memory): the rows a command prints, and one record per row.

Each printed table is a record kind of its own (`profile-category`, `memory-alloc`, ...), so
`stepscope show <out>/profile-category.jsonl --group-by phase` renders it again later. A row record's
config is the point's config plus the columns that identify the row (`keys`); the rest are its metrics.

A point's table records are written before its own summary record (the one `--resume` looks for), and each
carries `point`, the key of that summary record. An interruption between the two leaves tables without a
summary; a resumed sweep removes them (`remove_unfinished`) before it measures the point again, so resuming
never duplicates a table row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.results.store import RecordStore, make_record, point_key

TABLES_PAUSE_ENV = "STEPSCOPE_TEST_TABLES_PAUSE_S"
"""Tests only: seconds to wait after a point's table records, before its summary record (to interrupt a sweep
exactly there, on purpose)."""


@dataclass
class Table:
    """One table of a point."""

    kind: str
    """Record kind (and file name `<out>/<kind>.jsonl`)."""
    title: str
    """Title printed above the table."""
    keys: tuple[str, ...]
    """Columns that identify a row within the point (they go into the record's config)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The rows, as printed (metric columns carry their unit in the name)."""

    def records(self, point_config: dict[str, Any], env: dict[str, Any], point: str) -> list[dict[str, Any]]:
        """One record per row; `point` is the key of the point's summary record."""
        out = []
        for row in self.rows:
            config = {**point_config, **{key: row[key] for key in self.keys}}
            metrics = {name: value for name, value in row.items() if name not in self.keys}
            out.append({**make_record(self.kind, config, metrics, env=env), "point": point})
        return out


def check_tables_writable(out_dir: str | Path, kinds: Sequence[str]) -> None:
    """Prove every table's record file can be appended to, before any work (UsageError if not)."""
    for kind in kinds:
        RecordStore(out_dir, kind).check_writable()


def append_tables(out_dir: str | Path, tables: Sequence[Table], point_kind: str, point_config: dict[str, Any],
                  env: dict[str, Any]) -> None:
    """Append one record per row of every table to `<out_dir>/<kind>.jsonl`, each tagged with the key of the
    point's summary record (kind `point_kind`, config `point_config`), which the caller appends next."""
    point = point_key(point_kind, point_config)
    for table in tables:
        store = RecordStore(out_dir, table.kind)
        for record in table.records(point_config, env, point):
            store.append(record)
    pause = os.environ.get(TABLES_PAUSE_ENV, "").strip()
    if pause:
        time.sleep(float(pause))


def remove_unfinished(out_dir: str | Path, kinds: Sequence[str], finished: set[str]) -> int:
    """Remove from `<out_dir>/<kind>.jsonl` the table records of points whose summary record is not among
    `finished` (the keys a resume skips): leftovers of a point interrupted before its summary, or of one that
    failed, which the resume measures again. Records without `point` (older files) are kept. Returns how many
    were removed."""
    return sum(RecordStore(out_dir, kind).remove(lambda r: "point" in r and r["point"] not in finished)
               for kind in kinds)
