"""A study: every record read from the folders and files a report covers, grouped by kind, and each kind's tables
(one per `config.record` value where a kind stores several sorts of record, as `comm` and `trace` do)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.results.store import read_records

KIND_ORDER = ("step", "step-ab", "profile", "memory", "attention", "precision", "comm", "ddp", "moe", "innet",
              "trace", "predict", "plan", "compare", "calibrate", "validate")
"""Sections in the order of the README (measure, communicate, analyse, model); a kind not listed (a
`profile-*` table, a kind added later) follows its family, unknown families go last."""


@dataclass
class Study:
    """The records of a report, by kind in page order."""

    paths: list[str]
    kinds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [record for records in self.kinds.values() for record in records]


def load_study(paths: Sequence[str | os.PathLike]) -> Study:
    """Read every record of the given .jsonl files and results folders (UsageError when there are none)."""
    if not paths:
        raise UsageError("give at least one results folder or .jsonl file")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in read_records(*paths):  # a file reached twice (a folder and a file in it) is read once
        by_kind.setdefault(str(record.get("kind") or "unknown"), []).append(record)
    if not by_kind:
        raise UsageError(f"no stepscope records in {', '.join(str(p) for p in paths)}")
    ordered = dict(sorted(by_kind.items(), key=lambda item: _order(item[0])))
    return Study([str(Path(p)) for p in paths], ordered)


def _order(kind: str) -> tuple[int, int, str]:
    family = next((i for i, name in enumerate(KIND_ORDER) if kind == name or kind.startswith(name + "-")),
                  len(KIND_ORDER))
    return family, 0 if kind in KIND_ORDER else 1, kind


def sub_tables(records: Sequence[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """A kind's records split by `config.record` (comm points and fits, trace ranks and steps, ...): each sort
    has its own columns, so each gets its own table; kinds without that field give one table (key None)."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for record in records:
        value = (record.get("config") or {}).get("record")
        groups.setdefault(None if value is None else str(value), []).append(record)
    return groups
