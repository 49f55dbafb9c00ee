"""Tables of one measured point (profile, memory): the rows a command prints, and one record per row.

Each printed table is a record kind of its own (`profile-category`, `memory-alloc`, ...), so
`stepscope show <out>/profile-category.jsonl --group-by phase` renders it again later. A row record's
config is the point's config plus the columns that identify the row (`keys`); the rest are its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

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


class TableEmitter:
    """Print a point's tables through a `stepscope.cli.output.Printer`: titled tables for `table`/`md`;
    for `json` one object per row with the table kind and the point's fields; for `csv` every row of every
    point in one block at `finish()` (a CSV file has one header, and the tables have different columns)."""

    def __init__(self, printer: Any) -> None:
        self.printer = printer
        self._csv_rows: list[dict[str, Any]] = []

    def emit(self, tables: Sequence[Table], point: dict[str, Any], title: str) -> None:
        if self.printer.fmt in ("table", "md"):
            self.printer.note(title)
            for table in tables:
                self.printer.emit(table.rows, title=table.title)
            return
        self._emit_rows([{"table": table.kind, **point, **row} for table in tables for row in table.rows])

    def _emit_rows(self, rows: list[dict[str, Any]]) -> None:
        if self.printer.fmt == "csv":
            self._csv_rows.extend(rows)
        else:
            self.printer.emit(rows)

    def on_record(self, header: Callable[[Any, Any], str]) -> Callable[[dict[str, Any], Any, Any], None]:
        """A sweep's `on_record` callback for points whose config has a `.step` (StepConfig): an `oom` row,
        or the point's `header(config, result)` and its tables."""

        def show(record: dict[str, Any], config: Any, result: Any) -> None:
            point = {**point_fields(config.step), "threads": effective_threads(record)}
            if result is None:  # an oom row: in the CSV block too, which has one header for every row
                self._emit_rows([{"table": record["kind"], **point, "status": record["status"],
                                  "note": record.get("note")}])
            else:
                self.emit(result.tables(), point, header(config, result))

        return show

    def finish(self) -> None:
        """Print the CSV block (every row under one header: the union of the tables' columns)."""
        self.printer.emit(self._csv_rows)
        self._csv_rows = []


def point_fields(step: Any) -> dict[str, Any]:
    """The identity of a step point (a StepConfig) in machine-readable output."""
    return {"model": step.model.name, **step.workload.to_dict(), "attention": step.attention, "threads": step.threads}


def effective_threads(record: dict[str, Any]) -> int | None:
    """The intra-op thread count a point ran with, also without --threads (where the config says None):
    the measured count in the metrics, else the record's environment (an `oom` row has no metrics)."""
    metrics, env = record.get("metrics") or {}, record.get("env") or {}
    return metrics.get("threads", env.get("threads"))


def point_title(step: Any) -> str:
    """`small batch 4 seq 128 train fp32 sdpa`."""
    workload = step.workload
    return (f"{step.model.name} batch {workload.batch} seq {workload.seq} {workload.mode} {workload.precision} "
            f"{step.attention}")
