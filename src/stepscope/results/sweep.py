"""Run a list of sweep points into a record store: resume, OOM rows, records appended as points finish.

Used by every sweeping command. No torch here: the caller says what an out-of-memory error looks like.
Ctrl-C propagates (KeyboardInterrupt) after the finished points are safely on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from stepscope.results.store import RecordStore, make_record, point_key
from stepscope.results.tables import remove_unfinished

P = TypeVar("P")


@dataclass
class SweepOutcome:
    """What a sweep did: records written (in order), keys skipped because they were done already, and the plot
    it drew (if it draws one)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    plot: Path | None = None


@dataclass
class Sweep(Generic[P]):
    """Points plus how to describe and measure one of them."""

    kind: str
    """Record kind (and file name: <out>/<kind>.jsonl)."""
    points: Sequence[P]
    config_of: Callable[[P], dict[str, Any]]
    """The point's full configuration, as stored in the record (and hashed for --resume)."""
    measure: Callable[[P], tuple[dict[str, Any], Any]]
    """Measure one point: (metrics, a result object handed to `on_record`)."""
    env_of: Callable[[P], dict[str, Any]]
    """The record's environment for a point (its thread count, not the sweep process's default)."""
    is_oom: Callable[[BaseException], bool] = lambda error: isinstance(error, MemoryError)
    """Whether an exception of `measure` is an out-of-memory error (an `oom` row; anything else propagates)."""
    after_oom: Callable[[], None] = lambda: None
    """Clean-up after an OOM (e.g. free cached device memory) before the next point."""
    table_kinds: Sequence[str] = ()
    """Kinds of the table records `measure` appends before the point's own record (`results.tables`): a resume
    removes those of unfinished points first, so measuring them again duplicates nothing."""

    def run(self, out: str | os.PathLike | None, *, resume: bool = False,
            on_record: Callable[[dict[str, Any], P, Any], None] = lambda record, point, result: None) -> SweepOutcome:
        """Measure every point not yet in `<out>/<kind>.jsonl` (with `resume`), appending each record as it is
        made (`out` None: records are only returned); `on_record(record, point, result)` follows every append
        (`result` None for an `oom` row)."""
        store = RecordStore(out, self.kind).check_writable() if out is not None else None
        outcome = SweepOutcome()
        done = store.done_keys() if (store is not None and resume) else set()
        if store is not None and resume:
            remove_unfinished(store.path.parent, self.table_kinds, done)
        for point in self.points:
            config = self.config_of(point)
            if point_key(self.kind, config) in done:
                outcome.skipped += 1
                continue
            result = None
            try:
                metrics, result = self.measure(point)
                record = make_record(self.kind, config, metrics, env=self.env_of(point))
            except Exception as error:  # noqa: BLE001 - only OOM is turned into a row; the rest re-raised
                if not self.is_oom(error):
                    raise
                self.after_oom()
                first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                record = make_record(self.kind, config, {}, status="oom", env=self.env_of(point),
                                     note=first_line[:300])
            if store is not None:
                store.append(record)
            outcome.records.append(record)
            on_record(record, point, result)
        return outcome
