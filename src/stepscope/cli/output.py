"""Print result rows as they arrive, in the chosen format (csv header once, json one object per line)."""

from __future__ import annotations

import sys
from typing import Any, Sequence, TextIO

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
