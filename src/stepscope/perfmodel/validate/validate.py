"""Predict the published measured runs shipped with stepscope (`validate.datasets`) and report the error of each:
`run_validate` predicts a dataset and appends one `validate` record per run.

Every run is predicted from first principles with its system preset and the assumptions its dataset documents
(Narayanan et al. 2021's Table 1: docs/perfmodel.md, "stepscope validate"; the other datasets: each row's notes,
docs/validation-data.md); none is fitted per row.

Cross-validation (`ValidateConfig.cross_validate`): each run is also predicted with its system calibrated on
the *other* runs of that system in the dataset (leave-one-out: one factor on the efficiency curve,
`calibrate.published.fit_factor`), the accuracy an HPC centre can expect after calibrating on its own runs, with
no run ever predicted by a fit that saw it. Runs alone on their system are not cross-validated.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import COMM_CAUSES, Prediction, evaluate
from stepscope.perfmodel.runs import RunRecords, SystemLike, check_choice, system_of
from stepscope.perfmodel.validate.datasets import DATASETS, PublishedRun, load_dataset, read_runs
from stepscope.perfmodel.validate.sources import by_source
from stepscope.perfmodel.validate.trends import trend_rows
from stepscope.spec.system import SystemSpec

__all__ = ["DATASETS", "PublishedRun", "ValidateConfig", "ValidateOutcome", "ValidationRow", "load_dataset",
           "median_abs_error", "run_validate", "validate"]

@dataclass(frozen=True)
class ValidationRow:
    run: PublishedRun
    prediction: Prediction
    held_out: tuple[float, float] | None = None
    """(efficiency factor fitted to the other runs of the system, predicted step time with it), when
    cross-validated."""

    @property
    def source_key(self) -> str:
        return self.run.source_key

    @property
    def system(self) -> str:
        return self.run.system

    @property
    def measured_s(self) -> float:
        return self.run.measured_step_s

    @property
    def predicted_s(self) -> float:
        return self.prediction.step_s

    @property
    def held_out_error(self) -> float | None:
        """Relative error of the leave-one-out prediction (None: not cross-validated)."""
        if self.held_out is None:
            return None
        return (self.held_out[1] - self.run.measured_step_s) / self.run.measured_step_s

    @property
    def error(self) -> float:
        """Relative error of the predicted step time: (predicted − measured) / measured."""
        return (self.prediction.step_s - self.run.measured_step_s) / self.run.measured_step_s

    def row(self) -> dict[str, Any]:
        p, run = self.prediction, self.run
        # like with like: the paper's own FLOP count (with recomputation) over the predicted time
        predicted_tflops = run.published_flops / p.step_s / run.plan.gpus / 1e12
        plan = f"tp{run.plan.tp} pp{run.plan.pp} dp{run.plan.dp}"
        modern = {}
        if run.source != "narayanan2021_table1":  # the modern plans say more
            plan = run.plan.describe()
            modern = {"system": run.system, "precision": run.workload.precision, "seq": run.workload.seq}
        held_out = {}
        if self.held_out is not None:
            held_out = {"loo_factor": self.held_out[0], "loo_error_pct": 100 * self.held_out_error}
        return {"run": run.label, "gpus": run.plan.gpus, "plan": plan, **modern,
                "batch": run.workload.batch, "measured_step_s": run.measured_step_s, "predicted_step_s": p.step_s,
                "error_pct": 100 * self.error, "measured_TFLOPps_per_gpu": run.measured_tflops_per_gpu,
                "predicted_TFLOPps_per_gpu": predicted_tflops, "bubble_pct": 100 * p.phases["bubble"] / p.step_s,
                "comm_pct": 100 * sum(p.breakdown[c] for c in COMM_CAUSES) / p.step_s,
                "mem_GiB": p.memory.total / 2**30, **held_out}


def load_runs(dataset: str) -> list[PublishedRun]:
    """The runs of a shipped dataset, of all of them (`all`), or of a CSV file in the `modern_runs` schema
    (docs/validation-data.md)."""
    if dataset == "all":
        return [run for name in DATASETS for run in load_dataset(name)]
    if dataset in DATASETS:
        return load_dataset(dataset)
    path = Path(dataset)
    if path.suffix != ".csv" and not path.exists():
        raise UsageError(f"--dataset must be one of {', '.join(DATASETS)}, all, or a .csv file; got {dataset!r}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read dataset {path}: {error}".splitlines()[0]) from None
    try:
        return read_runs(text, path.name)
    except (KeyError, ValueError) as error:
        raise UsageError(f"{path.name}: not in the validation schema ({type(error).__name__}: {error}); "
                         f"see docs/validation-data.md") from None


def validate(system: SystemSpec | None = None, dataset: str = DATASETS[0],
             runs: list[PublishedRun] | None = None) -> list[ValidationRow]:
    """Predict every run of `dataset` (`load_runs`), or the `runs` given, on `system` (default: each run's own
    system preset)."""
    return [ValidationRow(run, evaluate(run.model, run.workload, run.plan, system or system_of(run.system)))
            for run in (load_runs(dataset) if runs is None else runs)]


def median_abs_error(rows: list[ValidationRow]) -> float:
    return median(abs(r.error) for r in rows)


def cross_validate(rows: list[ValidationRow], tolerance: float = 1e-3) -> list[ValidationRow]:
    """`rows` with each run also predicted by its system fitted to the other runs of that system (leave one
    out); runs alone on their system come back unchanged."""
    out = []
    for row in rows:
        others = [r.run for r in rows if r.run.system == row.run.system and r.run.label != row.run.label]
        if not others:
            out.append(row)
            continue
        from stepscope.perfmodel.calibrate.published import fit_factor, with_factor  # it reads runs through us

        factor = fit_factor(others, with_factor, tolerance)
        step_s = with_factor(row.run, factor)
        out.append(dataclasses.replace(row, held_out=(factor, step_s)))
    return out


BY = ("run", "source", "trend")


@dataclass(frozen=True)
class ValidateConfig:
    """Which published runs to predict, on which system."""

    system: SystemLike | None = None
    """System preset, TOML file or SystemSpec for every run (None: each run's own, A100-80GB for Narayanan)."""
    dataset: str = DATASETS[0]
    """One of `DATASETS`, `all`, or a CSV file in the `modern_runs` schema."""
    by: str = "run"
    """`run`: a row per run; `source`: a row per publication (`sources.by_source`); `trend`: a row per trend set
    whose runs were validated (`trends.trend_rows`)."""
    cross_validate: bool = False
    """Also predict each run with its system calibrated on the dataset's other runs of that system."""


@dataclass(frozen=True)
class ValidateOutcome:
    dataset: str
    system: str
    """The system every run was predicted on, or the runs' systems joined by `+`."""
    rows: list[ValidationRow] = field(default_factory=list)
    path: Path | None = None
    """The records file (None: no records were written)."""

    def title(self) -> str:
        return f"{self.dataset} on {self.system}: predicted vs measured step time"

    def sources(self) -> list[dict[str, Any]]:
        """Errors by source, after one factor per source and with each source left out (`sources.by_source`)."""
        return by_source(self.rows)

    def trends(self) -> list[dict[str, Any]]:
        """Published against predicted ratios between runs (`trends.trend_rows`)."""
        return trend_rows(self.rows)

    def summary(self) -> str:
        """One line: the median and the largest absolute error."""
        line = (f"median absolute error: {100 * median_abs_error(self.rows):.1f}% over {len(self.rows)} runs "
                f"(largest {100 * max(abs(r.error) for r in self.rows):.1f}%)")
        held = [abs(r.held_out_error) for r in self.rows if r.held_out_error is not None]
        if held:
            alone = len(self.rows) - len(held)
            line += (f"; leave-one-out (each run's system calibrated on its other runs): {100 * median(held):.1f}% "
                     f"over {len(held)} runs (largest {100 * max(held):.1f}%)"
                     + (f", {alone} alone on their system" if alone else ""))
        return line


def run_validate(config: ValidateConfig = ValidateConfig(), out: str | os.PathLike | None = None) -> ValidateOutcome:
    """Predict every run of the dataset and append one `validate` record each to `<out>/validate.jsonl`
    (None: no records)."""
    check_choice(config.by, BY)
    system = system_of(config.system) if config.system is not None else None
    runs = load_runs(config.dataset)  # a bad dataset is refused before the records folder exists
    records = RunRecords(out, "validate")
    rows = validate(system, runs=runs)
    if config.cross_validate:
        if system is not None:
            raise UsageError("--cross-validate calibrates each run's own system: leave --system out")
        rows = cross_validate(rows)
    names = system.name if system else "+".join(dict.fromkeys(system_of(r.run.system).name for r in rows))
    for r in rows:
        records.append({"dataset": config.dataset, "run": r.run.label,
                        "system": system.name if system else system_of(r.run.system).name,
                        "source": r.run.citation,
                        "model_spec": r.run.model.to_dict(), **r.run.workload.to_dict(), "plan": r.run.plan.to_dict()},
                       {k: v for k, v in r.row().items() if k not in ("run", "plan")})
    return ValidateOutcome(config.dataset, names, rows, records.path)
