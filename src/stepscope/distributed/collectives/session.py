"""A whole `stepscope comm` request, measured or imported: the jobs, the records, the α–β fits and the plot.

    outcome = run_comm(CommConfig(backends=("gloo",), worlds=(2, 4)), "stepscope-results", fit=True,
                       plot="stepscope-results/comm.png")
    outcome = import_comm(["nccl-tests.log"], "stepscope-results", fit=True)

Records (kind `comm`, in `<out>/comm.jsonl`): measured or imported points (config `"record": "point"`), and
α–β fits (`"record": "fit"`, see `alpha_beta`), a fit appended only when it differs from the one stored (a
rerun of `--resume --fit` adds no duplicate). With `resume`, points already stored are skipped, and the fits
and the plot use the whole sweep: the points of earlier runs of the same request and this run's. Notes about
the run (the backend `auto` chose, sizes rounded or skipped, points a resume skipped) go to `on_note` as they
arise; each finished job goes to `on_job`. Under torchrun/Slurm only rank 0 reports (`reporting`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.benchmark import JobResult, plan_jobs, run_job, sweep_records
from stepscope.distributed.collectives.config import CommConfig, resolve_auto
from stepscope.results.files import check_plot_file
from stepscope.results.store import RecordStore

Note = Callable[[str], None]


@dataclass
class CommOutcome:
    """What a request measured or imported, fitted and plotted."""

    records: list[dict[str, Any]] = field(default_factory=list)
    """This run's point records (measured, or imported), in order."""
    sweep: list[dict[str, Any]] = field(default_factory=list)
    """The points the fits and the plot use: this run's, and with --resume those of earlier runs too."""
    fits: list[dict[str, Any]] = field(default_factory=list)
    """α–β fit records (with `fit`)."""
    syscalls: list[dict[str, Any]] = field(default_factory=list)
    """`syscalls` records (with `--tally syscalls`, see `syscall_tally`), per job and point."""
    fit_notes: list[str] = field(default_factory=list)
    """Why a group of points has no fit (too few sizes, a single rank)."""
    plot: Path | None = None
    """The plot written (None: none asked for, or nothing to plot)."""
    reporting: bool = True
    """False on every rank but 0 under torchrun/Slurm (rank 0 reports)."""

    @property
    def wrong(self) -> list[dict[str, Any]]:
        """This run's points that returned wrong results (a benchmark of wrong results is no success)."""
        return [r for r in self.records if r.get("status") == "mismatch"]


def run_comm(config: CommConfig, out: str | os.PathLike | None = None, *, resume: bool = False,
             fit: bool = False, plot: str | os.PathLike | None = None, on_note: Note = lambda text: None,
             on_job: Callable[[JobResult], None] = lambda result: None) -> CommOutcome:
    """Measure every job of the request (see the module docstring); the request is checked, `auto` resolved
    and every file proven writable before any rank starts."""
    from stepscope.distributed.launch.ranks import external_launch_env

    backends, auto_note = resolve_auto(config.backends, config.worlds)
    config = dataclasses.replace(config, backends=backends)
    config.validate()
    store = RecordStore(out, "comm").check_writable() if out is not None else None
    if plot is not None:
        check_plot_file(plot)
    external = external_launch_env()
    outcome = CommOutcome(reporting=external is None or external["rank"] == 0)
    say = on_note if outcome.reporting else (lambda text: None)
    jobs = plan_jobs(config)
    if auto_note:
        say(f"note: {auto_note}")
    for job in jobs:
        for rounding in job.roundings:
            say(f"note: {rounding.message()}")
        for skipped in job.skipped:
            say(f"note: {skipped}")
    strace = None
    if config.syscalls:
        from stepscope.distributed.tracing.strace import find_strace

        strace = find_strace()
    for job in jobs:
        result = run_job(job, config, store, resume=resume)
        if result is None:  # not rank 0 under torchrun/Slurm
            continue
        outcome.records.extend(result.records)
        if result.skipped_done:
            say(f"skipped {result.skipped_done} point(s) of {job.backend} on {job.world_size} ranks already in "
                f"{store.path} (--resume)")
        if outcome.reporting:
            on_job(result)
        if strace is not None and result.records:  # the same job again under strace (`syscall_tally`)
            from stepscope.distributed.collectives.syscall_tally import trace_job

            say(f"tracing {job.backend} on {job.world_size} ranks under strace ...")
            traced = trace_job(job, config, strace=strace, untraced=result.records)
            for record in traced:
                if store is not None:
                    store.append(record)
            outcome.syscalls.extend(traced)
    if not outcome.reporting:
        return outcome
    outcome.sweep = outcome.records
    if resume and store is not None:  # fit and plot the whole sweep: the points of earlier runs of it and this run's
        outcome.sweep = sweep_records(config, store)
        earlier = len(outcome.sweep) - len({r["key"] for r in outcome.records} & {r["key"] for r in outcome.sweep})
        if earlier:
            say(f"fit and plot use {len(outcome.sweep)} point(s) of this sweep: {earlier} from earlier runs in "
                f"{store.path} (--resume)")
    _fit_and_plot(outcome, store, fit=fit, plot=plot)
    return outcome


def import_comm(paths: Sequence[str | os.PathLike], out: str | os.PathLike | None = None, *, resume: bool = False,
                op_hint: str | None = None, world_hint: int | None = None, fit: bool = False,
                plot: str | os.PathLike | None = None, on_note: Note = lambda text: None) -> CommOutcome:
    """Read nccl-tests logs into `comm` records (with `resume`, points already stored are not appended again),
    then fit and plot them like a measured sweep. `op_hint`/`world_hint` name what a log does not say."""
    from stepscope.distributed.collectives.nccl_tests_format import import_records

    records = [record for path in paths for record in import_records(path, op_hint=op_hint, world_hint=world_hint)]
    store = RecordStore(out, "comm").check_writable() if out is not None else None
    if plot is not None:
        check_plot_file(plot)
    done = store.done_keys() if (store is not None and resume) else set()
    fresh = [r for r in records if r["key"] not in done]
    if store is not None:
        for record in fresh:
            store.append(record)
    on_note(f"imported {len(records)} point(s) from {len(paths)} file(s)"
            + (f"; {len(records) - len(fresh)} already in {store.path}" if len(fresh) < len(records) else ""))
    outcome = CommOutcome(records=records, sweep=records)
    _fit_and_plot(outcome, store, fit=fit, plot=plot)
    return outcome


def _fit_and_plot(outcome: CommOutcome, store: RecordStore | None, *, fit: bool,
                  plot: str | os.PathLike | None) -> None:
    """α–β fits of the sweep's points (stored unless the same fit is stored already), then the plot."""
    if fit:
        from stepscope.distributed.collectives.alpha_beta import fit_records

        outcome.fits, outcome.fit_notes = fit_records(outcome.sweep)
        if store is not None:
            stored = {r["key"]: r.get("metrics") for r in store.records()
                      if r.get("config", {}).get("record") == "fit"}
            for record in outcome.fits:
                if stored.get(record["key"]) != record["metrics"]:
                    store.append(record)
    if plot is not None:
        from stepscope.distributed.collectives.plot import plot_comm

        outcome.plot = plot_comm(outcome.sweep + outcome.fits, plot, title="stepscope comm")
