"""Print result rows as they arrive, in the chosen format (csv header once, json one object per line)."""

from __future__ import annotations

import sys
from typing import Any, Sequence, TextIO

from stepscope.results.views import render


class Printer:
    """Incremental output of row batches: tables get a title each, CSV keeps one header."""

    def __init__(self, fmt: str = "table", stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.stream = stream or sys.stdout
        self._csv_columns: list[str] | None = None

    def emit(self, rows: Sequence[dict[str, Any]], *, title: str | None = None,
             columns: Sequence[str] | None = None) -> None:
        if not rows:
            return
        text = render(rows, fmt=self.fmt, columns=columns, title=title)
        if self.fmt == "csv":
            header, _, body = text.partition("\n")
            if self._csv_columns is None:
                self._csv_columns = header.split(",")
                text = header + ("\n" + body if body else "")
            else:
                text = body
        elif self.fmt in ("table", "md"):
            text += "\n"
        if text:
            print(text, file=self.stream, flush=True)

    def note(self, message: str) -> None:
        """Human remarks go to stderr when the output is machine-readable, so stdout stays parseable."""
        stream = self.stream if self.fmt in ("table", "md") else sys.stderr
        print(message, file=stream, flush=True)
