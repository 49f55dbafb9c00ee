"""Tables of one measured point (profile, memory): the rows a command prints, and one record per row.

Each printed table is a record kind of its own (`profile-category`, `memory-alloc`, ...), so
`stepscope show <out>/profile-category.jsonl --group-by phase` renders it again later. A row record's
config is the point's config plus the columns that identify the row (`keys`); the rest are its metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.results.store import RecordStore, make_record


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

    def records(self, point_config: dict[str, Any], env: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for row in self.rows:
            config = {**point_config, **{key: row[key] for key in self.keys}}
            metrics = {name: value for name, value in row.items() if name not in self.keys}
            out.append(make_record(self.kind, config, metrics, env=env))
        return out


def check_tables_writable(out_dir: str | Path, kinds: Sequence[str]) -> None:
    """Prove every table's record file can be appended to, before any work (UsageError if not)."""
    for kind in kinds:
        RecordStore(out_dir, kind).check_writable()


def append_tables(out_dir: str | Path, tables: Sequence[Table], point_config: dict[str, Any],
                  env: dict[str, Any]) -> None:
    """Append one record per row of every table to `<out_dir>/<kind>.jsonl`."""
    for table in tables:
        store = RecordStore(out_dir, table.kind)
        for record in table.records(point_config, env):
            store.append(record)
