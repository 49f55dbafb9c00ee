"""Print result rows as they arrive, in the chosen format (csv header once, json one object per line); the
tables of a profile or memory point; the few words that identify a measured step point."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from stepscope.results.views import columns_of, render


class Printer:
    """Incremental output of row batches: tables get a title each, CSV keeps one header."""

    def __init__(self, fmt: str = "table", stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.stream = stream or sys.stdout
        self._csv_columns: list[str] | None = None

    def emit(self, rows: Sequence[dict[str, Any]], *, title: str | None = None,
             columns: Sequence[str] | None = None) -> None:
        """Print one batch of rows. CSV: a batch whose columns are all in the current header is written
        under it (missing cells empty), so a sweep stays one well-formed CSV however its rows vary; a batch
        with other columns (another table) starts a new header."""
        if not rows:
            return
        if self.fmt == "csv":
            columns = list(columns) if columns else columns_of(rows)
            if self._csv_columns is not None and set(columns) <= set(self._csv_columns):
                text = render(rows, fmt="csv", columns=self._csv_columns).partition("\n")[2]
            else:
                self._csv_columns = columns
                text = render(rows, fmt="csv", columns=columns)
        else:
            text = render(rows, fmt=self.fmt, columns=columns, title=title)
            if self.fmt in ("table", "md"):
                text += "\n"
        if text:
            print(text, file=self.stream, flush=True)

    def note(self, message: str) -> None:
        """Human remarks go to stderr when the output is machine-readable, so stdout stays parseable."""
        stream = self.stream if self.fmt in ("table", "md") else sys.stderr
        print(message, file=stream, flush=True)


class TableEmitter:
    """Print a point's tables through a `Printer`: titled tables for `table`/`md`;
    for `json` one object per row with the table kind and the point's fields; for `csv` every row of every
    point in one block at `finish()` (a CSV file has one header, and the tables have different columns)."""

    def __init__(self, printer: Any) -> None:
        self.printer = printer
        self._csv_rows: list[dict[str, Any]] = []

    def emit(self, tables: Sequence[Any], point: dict[str, Any], title: str) -> None:
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
    """The identity of a step point (a StepConfig) in machine-readable output: the fields a point overrides of its
    preset are columns too."""
    return {"model": step.model.name, **overridden_fields(step.model), **step.workload.to_dict(),
            "attention": step.attention, "threads": step.threads}


def overridden_fields(spec: Any) -> dict[str, Any]:
    """The fields of a ModelSpec that differ from its preset (`--n-layers 2`: {"n_layers": 2}); {} for a model
    that is no preset."""
    from stepscope.errors import UsageError
    from stepscope.spec import get_preset

    try:
        preset = get_preset(spec.name).to_dict()
    except (UsageError, KeyError):
        return {}
    return {k: v for k, v in spec.to_dict().items() if k != "name" and preset.get(k) != v}


def model_label(spec: Any) -> str:
    """The model as titles name it: its preset and what the point overrides (`small n_layers 2`), so the points of
    a sweep over a field (`--n-layers 2,4`) tell apart."""
    return " ".join([spec.name, *(f"{k} {v}" for k, v in overridden_fields(spec).items())])


def summary_columns(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    """`columns` that some row has, with the model fields that differ between the rows (a swept `--n-layers`)
    right after `model`."""
    import dataclasses

    from stepscope.results.views import varying_columns
    from stepscope.spec import ModelSpec

    swept = varying_columns(rows, [f.name for f in dataclasses.fields(ModelSpec) if f.name != "name"])
    out = [c for c in columns if any(row.get(c) is not None for row in rows)]
    at = out.index("model") + 1 if "model" in out else 0
    return out[:at] + [c for c in swept if c not in out] + out[at:]


def effective_threads(record: dict[str, Any]) -> int | None:
    """The intra-op thread count a point ran with, also without --threads (where the config says None):
    the measured count in the metrics, else the record's environment (an `oom` row has no metrics)."""
    metrics, env = record.get("metrics") or {}, record.get("env") or {}
    return metrics.get("threads", env.get("threads"))


def point_title(step: Any) -> str:
    """`small batch 4 seq 128 train fp32 sdpa` (`small n_layers 2 batch ...` where a field is overridden)."""
    workload = step.workload
    return (f"{model_label(step.model)} batch {workload.batch} seq {workload.seq} {workload.mode} {workload.precision} "
            f"{step.attention}")


def memory_header(config: Any, result: Any) -> str:
    """The lines above a memory point's tables: the point, how memory was measured, the files written."""
    text = f"== {point_title(config.step)} ({result.device})\nmeasured: {result.method}"
    if result.plot_path is not None:
        text += f"\ntimeline: {result.plot_path}"
    if result.snapshot_path is not None:
        text += f"\nsnapshot: {result.snapshot_path}"
    return text


class ProgressBar:
    """A rich progress bar on stderr, started by the first update whose total `wanted` accepts (a short job
    finishes before a bar would help); counts items or bytes."""

    def __init__(self, label: str, *, unit: str = "items", wanted: Callable[[int], bool] = lambda total: True) -> None:
        self.label, self.unit, self.wanted = label, unit, wanted
        self._progress = None
        self._task = None

    def update(self, done: int, total: int) -> None:
        if self._progress is None:
            if not self.wanted(total):
                return
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            counter = DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn()
            self._progress = Progress(self.label, BarColumn(), counter, TimeRemainingColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=total)
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
