"""`run_trace`: read every rank's trace, analyse it, compare the ranks, then write the records and the plot.

Rank files are read and analysed in worker processes (`TraceConfig.workers`; default one per core, at most one per
file), each returning only its rank's summary (`RankAnalysis`: windows, tables, paths; no event columns), so the
parent holds summaries and each worker one file's columns at a time: memory is bounded by `workers` files, not by
the job. One file is read in this process, a large one's blocks decoded by the workers (`read_trace`).

Every output file is checked before any work; nothing is written until every file has been read and analysed, so a
bad input (a truncated or non-trace JSON, a trace without GPU events, ranks of different jobs) leaves no half-written
results: one UsageError line, and the records file is as it was.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.host import usable_cores
from stepscope.results.environment import base_environment
from stepscope.results.files import check_plot_file, check_results_folder
from stepscope.results.store import RecordStore, make_record
from stepscope.traces.analyze import RankAnalysis, analyze
from stepscope.traces.config import TraceConfig
from stepscope.traces.critical_path_ranks import JobStepPath, job_paths
from stepscope.traces.peaks import check_system
from stepscope.traces.ranks import StepAcrossRanks, across_ranks, assign_ranks
from stepscope.traces.read import read_trace
from stepscope.traces.records import (
    CATEGORY_COLUMNS,
    STEP_COLUMNS,
    build_records,
    collective_rows,
    critical_path_rows,
    job_path_rows,
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
    paths: list[JobStepPath] = field(default_factory=list)
    """The critical path of each step across ranks (`traces/critical_path_ranks.py`)."""
    path: Path | None = None
    plot: Path | None = None
    records: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def shown(self) -> list[RankAnalysis]:
        """The ranks the tables list (`TraceConfig.show_ranks`): all, or the slowest by median step time."""
        if len(self.ranks) <= self.config.show_ranks:
            return self.ranks
        slowest = sorted(self.ranks, key=lambda r: -_median_step_us(r))[: self.config.show_ranks]
        return sorted(slowest, key=lambda r: r.rank)

    def step_rows(self) -> list[dict[str, Any]]:
        return step_rows(self.shown, self.config.launch_bound_share)

    def category_rows(self) -> list[dict[str, Any]]:
        rows = self.step_rows()
        return [{c: row.get(c) for c in CATEGORY_COLUMNS} for row in rows]

    def collective_rows(self) -> list[dict[str, Any]]:
        return collective_rows(self.shown)

    def straggler_rows(self) -> list[dict[str, Any]]:
        return straggler_rows(self.steps)

    def rank_step_ms(self) -> list[dict[str, Any]]:
        shown = {f"rank{r.rank}_ms" for r in self.shown}
        return [{k: v for k, v in row.items() if k == "step" or k in shown} for row in rank_step_ms(self.steps)]

    def top_rows(self, what: str) -> list[dict[str, Any]]:
        return top_rows(self.shown, what)

    def roofline_rows(self) -> list[dict[str, Any]]:
        return roofline_rows(self.shown, self.config.top)

    def roofline_totals(self) -> list[dict[str, Any]]:
        return roofline_totals(self.shown)

    def critical_path_rows(self) -> list[dict[str, Any]]:
        return critical_path_rows(self.shown)

    def job_path_rows(self) -> list[dict[str, Any]]:
        return job_path_rows(self.paths)

    step_columns = STEP_COLUMNS


def _median_step_us(rank: RankAnalysis) -> float:
    spans = sorted(w.breakdown.span_us for w in rank.steps) or [rank.total.breakdown.span_us]
    return spans[len(spans) // 2]


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
    ranks = assign_ranks(analyse_files(files, config, on_progress))
    steps = across_ranks(ranks)
    outcome = TraceOutcome(config, ranks, steps, job_paths(ranks))
    if out is not None:
        store = RecordStore(out, "trace").check_writable()
        env = base_environment()
        records = [make_record("trace", record_config, metrics, env=env)
                   for record_config, metrics in build_records(ranks, steps, config.launch_bound_share,
                                                                       outcome.paths)]
        store.extend(records)
        outcome.records = len(records)
        outcome.path = store.path
    if plot is not None:
        from stepscope.traces.plot import plot_steps

        outcome.plot = plot_steps(ranks, plot)
    return outcome



def write_trace_records(paths: tuple[str, ...], out: str | os.PathLike) -> Path:
    """Analyse the traces of one job and append their `trace` records to `<out>/trace.jsonl` (no plot, nothing
    printed); that file. What `calibrate --trace` hands the performance model."""
    outcome = run_trace(TraceConfig(paths=tuple(paths)), out)
    assert outcome.path is not None
    return outcome.path


def analyse_file(path: Path, top: int = 10, system: str | None = None, progress: Any = None,
                 workers: int = 1) -> RankAnalysis:
    """One rank file read (a large one by `workers` processes) and analysed: what a worker process does."""
    return analyze(read_trace(path, progress, workers), top, system)


def workers_for(config: TraceConfig, files: int) -> int:
    """Worker processes for `files` rank files: `config.workers`, else one per usable core; never more than files."""
    return max(1, min(config.workers or usable_cores(), files))


def analyse_files(files: list[Path], config: TraceConfig, on_progress: OnProgress | None = None) -> list[RankAnalysis]:
    """Every file's RankAnalysis, in the order of `files` (see the module docstring). The first failure (one
    UsageError line naming its file) cancels the files not started."""
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    workers = workers_for(config, len(files))
    if workers == 1:  # one file: its blocks may still be decoded by workers
        inner = (config.workers or usable_cores()) if len(files) == 1 else 1
        out = []
        for index, file in enumerate(files):
            done = sum(sizes[:index])
            progress = None if on_progress is None else (lambda n, done=done: on_progress(done + n, total))
            out.append(analyse_file(file, config.top, config.system, progress, inner))
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # fork where it is safe and cheap (Linux: the workers start without importing anything again)
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    results: list[RankAnalysis | None] = [None] * len(files)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(analyse_file, file, config.top, config.system): i for i, file in enumerate(files)}
        done = 0
        try:
            for future in as_completed(futures):
                index = futures[future]
                results[index] = future.result()
                done += sizes[index]
                if on_progress is not None:
                    on_progress(done, total)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [r for r in results if r is not None]
