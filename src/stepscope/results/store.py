"""The record store: one JSON-Lines file per record kind under an output folder, append-only.

A record is one measured or predicted point:
    {"schema": "stepscope/1", "kind": "step", "status": "ok", "key": "...",
     "config": {...}, "metrics": {"forward_ms_median": ...}, "env": {...}}
`status` is `ok`, or why a point has no timing: `oom`, `mismatch`, `unsupported`, `error`.
`key` identifies the point (kind + config) so an interrupted sweep can `--resume` without duplicates.

Crash safety: each record (or batch known together, `extend`) is one `write()` of whole lines to a file opened
with O_APPEND, followed by fsync; a reader skips a torn last line, and the next append starts on a fresh line. The
one exception to append-only: a resume removes the table rows of a point that never got its summary record
(`remove`, an atomic rewrite; see `results.tables`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.results.files import check_results_folder, make_folder, note_created
from stepscope.results.renames import upgrade

SCHEMA = "stepscope/1"
STATUSES = ("ok", "oom", "mismatch", "unsupported", "error")
DEFAULT_OUT = "stepscope-results"


def point_key(kind: str, config: dict[str, Any]) -> str:
    """Stable identity of a sweep point: a hash of its kind and canonical configuration."""
    text = json.dumps({"kind": kind, "config": config}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def make_record(kind: str, config: dict[str, Any], metrics: dict[str, Any] | None = None, *,
                status: str = "ok", env: dict[str, Any] | None = None, note: str | None = None) -> dict[str, Any]:
    """A record (see the module docstring); `note` says why a point has no metrics (oom, mismatch, ...)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    record: dict[str, Any] = {"schema": SCHEMA, "kind": kind, "status": status, "key": point_key(kind, config),
                              "config": config, "metrics": metrics or {}, "env": env or {}}
    if note:
        record["note"] = note
    return record


class RecordStore:
    """Append-only JSONL file `<out_dir>/<kind>.jsonl`."""

    def __init__(self, out_dir: str | os.PathLike, kind: str) -> None:
        self.kind = kind
        self.path = Path(out_dir) / f"{kind}.jsonl"

    def check_writable(self) -> RecordStore:
        """Create the folder and prove the file can be appended to, before any work is done."""
        check_results_folder(self.path.parent)
        existed = self.path.exists()
        try:
            make_folder(self.path.parent)
            with open(self.path, "a"):
                pass
        except OSError as error:
            raise UsageError(f"cannot write results to {self.path}: {error.strerror or error}") from None
        if not existed:
            note_created(self.path)
        return self

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as one whole line, durably (see the module docstring)."""
        self.extend([record])

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Append records that are known together (one analysis of a trace), as one `write()` and one fsync: a
        crash keeps the whole lines written before it, as for one record."""
        if not records:
            return
        line = "".join(json.dumps(r, default=_json_default, allow_nan=True) + "\n" for r in records)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if _ends_without_newline(fd):
                line = "\n" + line  # a torn line from a killed writer stays isolated
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        """Every readable record of the file ([] before the first append)."""
        return read_records(self.path) if self.path.exists() else []

    def done_keys(self) -> set[str]:
        """Keys of points already recorded (any status but `error`, which a resume retries)."""
        return {r["key"] for r in self.records() if r.get("status") != "error" and "key" in r}

    def remove(self, drop: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrite the file without the records `drop` selects (every other line kept as it was); returns how
        many were removed. The new file replaces the old one whole (written aside, fsynced, renamed), so a
        crash leaves one or the other, never half of each."""
        if not self.path.exists():
            return 0
        kept, removed = [], 0
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                record = _parse(line)
                if record is not None and drop(record):
                    removed += 1
                else:
                    kept.append(line if line.endswith("\n") else line + "\n")
        if removed:
            aside = self.path.with_name(self.path.name + ".rewrite")
            with open(aside, "w", encoding="utf-8") as handle:
                handle.writelines(kept)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(aside, self.path)
        return removed


def _ends_without_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def record_files(path: str | os.PathLike) -> list[Path]:
    """The .jsonl file `path`, or the .jsonl files of the folder `path` (sub-folders and dangling links that
    happen to end in .jsonl are not record files)."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.glob("*.jsonl") if p.is_file())
    if path.exists():
        return [path]
    raise UsageError(f"no such results file or folder: {path}")


def read_records(*paths: str | os.PathLike) -> list[dict[str, Any]]:
    """All records in .jsonl files, or in every .jsonl file of folders; torn or foreign lines skipped, a file
    named twice (a folder and a file in it) read once."""
    records: list[dict[str, Any]] = []
    seen: set[Path] = set()
    for file in (f for path in paths for f in record_files(path)):
        if file.resolve() in seen:
            continue
        seen.add(file.resolve())
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                records.extend(record for record in map(_parse, handle) if record is not None)
        except OSError as err:
            raise UsageError(f"cannot read {file}: {err.strerror or err}") from None
    return records


def _parse(line: str) -> dict[str, Any] | None:
    """The record on one line; None for a blank, torn or foreign line."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not (isinstance(record, dict) and record.get("schema") == SCHEMA and isinstance(record.get("kind"), str)):
        return None
    # a line of the right schema whose sections are not tables is not one of our records either
    if any(not isinstance(record.get(section, {}), dict) for section in ("config", "metrics", "env")):
        return None
    return upgrade(record)  # fields renamed since it was written: under today's names and units
