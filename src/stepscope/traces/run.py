"""`run_trace`: read every rank's trace, analyse it, compare the ranks, then write the records and the plot.

Every output file is checked before any work; nothing is written until every file has been read and analysed, so a
bad input (a truncated or non-trace JSON, a trace without GPU events, ranks of different jobs) leaves no half-written
results: one UsageError line, and the records file is as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.results.environment import base_environment
from stepscope.results.files import check_plot_file, check_results_folder
from stepscope.results.store import RecordStore, make_record
from stepscope.traces.analyze import RankAnalysis, analyze
from stepscope.traces.config import TraceConfig
from stepscope.traces.peaks import check_system
from stepscope.traces.ranks import StepAcrossRanks, across_ranks, assign_ranks
from stepscope.traces.read import read_trace
from stepscope.traces.records import (
    CATEGORY_COLUMNS,
    STEP_COLUMNS,
    build_records,
    collective_rows,
    critical_path_rows,
    rank_step_ms,
    roofline_rows,
    roofline_totals,
    step_rows,
    straggler_rows,
    top_rows,
)

TRACE_SUFFIXES = (".json", ".json.gz")
OnProgress = Callable[[int, int], None]
"""Told (bytes read, bytes in all files) as the files are read."""


def trace_files(paths: tuple[str, ...] | list[str]) -> list[Path]:
    """The trace files named or held (not recursively) by folders, in name order; UsageError when none."""
    if not paths:
        raise UsageError("no trace given (name .json / .json.gz files or folders of them)")
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise UsageError(f"no .json or .json.gz trace in folder {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"no such trace file or folder: {path}")
    return list(dict.fromkeys(files))


@dataclass
class TraceOutcome:
    """Every rank analysed, the steps across ranks, and where the records and the plot went."""

    config: TraceConfig
    ranks: list[RankAnalysis]
    steps: list[StepAcrossRanks]
    path: Path | None = None
    plot: Path | None = None
    records: int = 0
    notes: list[str] = field(default_factory=list)

    def step_rows(self) -> list[dict[str, Any]]:
        return step_rows(self.ranks, self.config.launch_bound_share)

    def category_rows(self) -> list[dict[str, Any]]:
        rows = self.step_rows()
        return [{c: row.get(c) for c in CATEGORY_COLUMNS} for row in rows]

    def collective_rows(self) -> list[dict[str, Any]]:
        return collective_rows(self.ranks)

    def straggler_rows(self) -> list[dict[str, Any]]:
        return straggler_rows(self.steps)

    def rank_step_ms(self) -> list[dict[str, Any]]:
        return rank_step_ms(self.steps)

    def top_rows(self, what: str) -> list[dict[str, Any]]:
        return top_rows(self.ranks, what)

    def roofline_rows(self) -> list[dict[str, Any]]:
        return roofline_rows(self.ranks, self.config.top)

    def roofline_totals(self) -> list[dict[str, Any]]:
        return roofline_totals(self.ranks)

    def critical_path_rows(self) -> list[dict[str, Any]]:
        return critical_path_rows(self.ranks)

    step_columns = STEP_COLUMNS


def run_trace(config: TraceConfig, out: str | os.PathLike | None = None,
              on_progress: OnProgress | None = None) -> TraceOutcome:
    """Analyse the traces of `config.paths` (one file per rank of one job) and append their `trace` records to
    `<out>/trace.jsonl` (out=None: none) and the plot to `config.plot` when given."""
    files = trace_files(config.paths)
    check_system(config.system)
    plot = Path(config.plot) if config.plot else None
    if out is not None:
        check_results_folder(out)
    if plot is not None:
        check_plot_file(plot)
    sizes = [f.stat().st_size for f in files]
    ranks = []
    for index, file in enumerate(files):
        done = sum(sizes[:index])
        progress = None if on_progress is None else (lambda n, done=done: on_progress(done + n, sum(sizes)))
        trace = read_trace(file, progress)
        ranks.append(analyze(trace, config.top, config.system))
        del trace  # the columns of one file at a time
    ranks = assign_ranks(ranks)
    steps = across_ranks(ranks)
    outcome = TraceOutcome(config, ranks, steps)
    if out is not None:
        store = RecordStore(out, "trace").check_writable()
        env = base_environment()
        for record_config, metrics in build_records(ranks, steps, config.launch_bound_share):
            store.append(make_record("trace", record_config, metrics, env=env))
            outcome.records += 1
        outcome.path = store.path
    if plot is not None:
        from stepscope.traces.plot import plot_steps

        outcome.plot = plot_steps(ranks, plot)
    return outcome

