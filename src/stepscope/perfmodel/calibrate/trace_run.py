"""`calibrate --trace`: analyse a user's traces, fit a system to their records (`calibrate.trace`), write the system
TOML and one `calibrate-trace` record.

The performance model reads no trace (it imports neither torch nor the trace reader): the caller passes the
function that turns trace files into `trace` records (`stepscope.traces.run.write_trace_records`), and the two
meet in those records, as measured and predicted runs meet everywhere else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.trace import TraceFit, fit_model, fit_shapes
from stepscope.perfmodel.runs import RunRecords
from stepscope.results.files import check_results_folder, check_writable_file
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import SystemSpec, system_to_toml

Analyse = Callable[[tuple[str, ...], "str | os.PathLike"], Path]
"""Trace files of one job and a results folder -> the file of their `trace` records written there."""


@dataclass(frozen=True)
class TraceCalibrationConfig:
    """Which traces (or their records), the system the fit starts from, the traced run (optional) and where the
    result goes."""

    traces: tuple[str, ...] = ()
    """Trace files (or folders of them) of one job, analysed first (`run_calibrate_trace`)."""
    records: tuple[str, ...] = ()
    """Record files or folders holding one job's `trace` records (what `calibrate_from_trace` reads)."""
    base: str | None = None
    """System preset or TOML the fit starts from (None: the preset whose accelerator is the trace's device)."""
    system_out: str = "calibrated.toml"
    """Where the fitted system TOML is written."""
    name: str = "calibrated-from-trace"
    """Name of the fitted system."""
    model: ModelSpec | None = None
    """The traced run's model (None: fit from the shapes only)."""
    workload: Workload | None = None
    plan: ParallelPlan | None = None


def trace_records(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    """The `trace` records of one job in `paths` (UsageError: none, or several jobs)."""
    from stepscope.results.store import read_records

    found = [r for r in read_records(*paths) if r.get("kind") == "trace" and r.get("status", "ok") == "ok"]
    # the same trace analysed again writes the same records again: the latest of each counts once
    records = list({json.dumps(r["config"], sort_keys=True, default=str): r for r in found}.values())
    if not records:
        raise UsageError(f"no trace records in {', '.join(paths)}")
    jobs = {r["config"].get("job") for r in records} - {None}
    if len(jobs) > 1:
        raise UsageError(f"the records hold {len(jobs)} traced jobs: give one job's records")
    return records


def base_system(records: list[dict[str, Any]], base: str | None) -> SystemSpec:
    """`base`, else the preset of the traced device (CPU for stepscope's own CPU traces)."""
    from stepscope.spec.system import load_system, preset_of_device

    if base:
        return load_system(base)
    devices = {r["config"].get("device") for r in records} - {None}
    for device in sorted(devices):
        preset = "CPU" if device == "CPU" else preset_of_device(device)
        if preset is not None:
            return load_system(preset)
    raise UsageError(f"no system preset for the traced device {', '.join(map(str, devices)) or '(unnamed)'}: "
                     "name one with --base")


def calibrate_from_trace(config: TraceCalibrationConfig) -> TraceFit:
    """The fitted system (see the module docstring); nothing written."""
    records = trace_records(config.records)
    base = base_system(records, config.base)
    fit = TraceFit(base)
    system = fit_shapes(records, base, fit)
    if config.model is not None and config.workload is not None and config.plan is not None:
        config.plan.check(config.model, config.workload.batch, config.workload.seq, None)
        system = fit_model(records, config.model, config.workload, config.plan, system, fit)
        for category in fit.categories:
            if category["measured_ms"] > 0:
                fit.add(f"{category['fitted_by']} (to {category['category']})", None, category["fitted_ms"],
                        f"measured {category['measured_ms']:.3f} ms per step")
    else:
        fit.notes.append("no --model: the per-category times (kernel overhead, bandwidth and curve level as the "
                         "model uses them) are not fitted; give the traced run's --model and plan to fit them")
    fit.system = dataclasses.replace(system, name=config.name,
                                     description=f"fitted by stepscope calibrate --trace to {len(records)} trace "
                                                 f"records, from {base.name}")
    return fit


@dataclass(frozen=True)
class TraceCalibrationOutcome:
    """The fit, where the system went and the record."""

    fit: TraceFit
    system_out: Path
    path: Path | None


def run_calibrate_trace(config: TraceCalibrationConfig, out: str | os.PathLike | None,
                        analyse: Analyse) -> TraceCalibrationOutcome:
    """Analyse `config.traces` with `analyse` (their records go to `out`, else to a folder removed after), fit the
    system (`calibrate_from_trace`), write it to `config.system_out` and one record to `<out>/calibrate-trace.jsonl`.
    The output files are checked before any work, and nothing is written unless the traces are read and fitted."""
    target = check_writable_file(config.system_out, "the system")
    if out is not None:
        check_results_folder(out)
    with tempfile.TemporaryDirectory() as folder:
        path = analyse(config.traces, out if out is not None else folder)
        fit = calibrate_from_trace(dataclasses.replace(config, records=(str(path),)))
    header = f"stepscope calibrate --trace {','.join(config.traces)}" + (
        f" --model {config.model.name}" if config.model else "")
    try:
        target.write_text(system_to_toml(fit.system, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    records = RunRecords(out, "calibrate-trace")
    records.append({"trace": list(config.traces), "base": config.base,
                    "model": config.model.name if config.model else None, "system_out": str(target)},
                   {"parameters": fit.rows, "categories": fit.categories})
    return TraceCalibrationOutcome(fit, target, records.path)
