"""`run_calibrate`: fit a system to measured records (`calibrate`), write it as a system TOML, check it against
the same records (in-sample), and append one `calibrate` record with the fitted parameters and their errors."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.measured import (
    DEFAULT_KNOTS_GFLOP,
    MAX_EFFICIENCY,
    PRIOR_WEIGHT,
    Calibration,
    calibrate,
    check_max_efficiency,
)
from stepscope.perfmodel.records import RecordSet, load_records, parse_where
from stepscope.perfmodel.runs import RunRecords, SystemLike, system_of
from stepscope.perfmodel.validate.compare import Comparison, compare, summary
from stepscope.results.files import check_writable_file
from stepscope.results.store import DEFAULT_OUT
from stepscope.spec.system import system_to_toml


@dataclass(frozen=True)
class CalibrateConfig:
    """What to fit, from which records, and where the fitted system goes."""

    records: tuple[str, ...] = (DEFAULT_OUT,)
    """Record files or folders (step, attention, comm)."""
    where: tuple[str, ...] = ()
    """Filters `FIELD=VALUE[,VALUE]`: only records whose config FIELD (dotted) has one of the values."""
    base: SystemLike = "CPU"
    """The system the fit starts from (preset, TOML file or SystemSpec); what the records leave open stays."""
    system_out: str = "calibrated.toml"
    """Where the fitted system TOML is written."""
    name: str = "calibrated"
    """Name of the fitted system."""
    knots: tuple[float, ...] = DEFAULT_KNOTS_GFLOP
    """Efficiency-curve knots in GFLOP, increasing."""
    prior_weight: float = PRIOR_WEIGHT
    """Pull of the elementwise rate, bandwidth and kernel overhead toward `base` (0: none)."""
    max_efficiency: float = MAX_EFFICIENCY
    """Cap of the efficiency curve, a fraction of the measured large-GEMM rate."""

    def check(self) -> None:
        """UsageError for settings the fit cannot use (before any file or folder is made)."""
        knots = list(self.knots)
        if not knots or any(not k > 0 for k in knots) or knots != sorted(set(knots)):
            given = ",".join(f"{k:g}" for k in knots)
            raise UsageError(f"--knots must be positive and strictly increasing, got {given}")
        if not 0 <= self.prior_weight < math.inf:
            raise UsageError(f"--prior-weight must be a finite number >= 0, got {self.prior_weight:g}")
        check_max_efficiency(self.max_efficiency)


@dataclass(frozen=True)
class CalibrateOutcome:
    """The fit, how well it explains its own records, and what was written."""

    result: Calibration
    measured: RecordSet
    fitted: list[Comparison]
    """The calibration records predicted on the fitted system."""
    system_out: Path
    path: Path | None = None
    """The records file (None: no records were written)."""

    def headline(self) -> str:
        return (f"fitted {self.result.system.name} to {len(self.result.points)} configurations "
                f"({self.result.iterations} active-set iterations)")

    def parameter_rows(self) -> list[dict[str, Any]]:
        """Every parameter of the fitted system and where its value comes from."""
        return [{"parameter": k, "value": v, "source": self.result.sources[k]}
                for k, v in self.result.parameters.items()]

    def fit_error(self) -> list[dict[str, Any]]:
        """Per phase, the error on the calibration records themselves (in-sample)."""
        return summary(self.fitted)

    def notes(self) -> list[str]:
        """What the fit could not determine, and which records were skipped."""
        lines = [f"note: {note}" for note in self.result.notes]
        if self.measured.skipped:
            lines.append("skipped: " + "; ".join(f"{n} {reason}" for reason, n in self.measured.skipped.items()))
        return lines


def run_calibrate(config: CalibrateConfig = CalibrateConfig(),
                  out: str | os.PathLike | None = None) -> CalibrateOutcome:
    """Fit `config.base` to the records, write the system TOML to `config.system_out` and append one `calibrate`
    record to `<out>/calibrate.jsonl` (None: no records). Settings, filters, the system file and the records
    folder are checked before the fit."""
    config.check()
    base = system_of(config.base)
    where = parse_where(config.where)
    # like --out, a missing folder is created (before the fit, so a bad path costs nothing)
    target = check_writable_file(config.system_out, "the system")
    measured = load_records(config.records, where)
    records = RunRecords(out, "calibrate")
    result = calibrate(measured, base, knots=config.knots, max_efficiency=config.max_efficiency,
                       prior_weight=config.prior_weight, name=config.name)
    header = (f"stepscope calibrate: {result.system.description}\n"
              f"records: {', '.join(str(r) for r in config.records)}"
              + (f"; filters: {' '.join(config.where)}" if config.where else ""))
    try:
        target.write_text(system_to_toml(result.system, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    fitted = compare(result.points, result.system)
    errors = summary(fitted)
    records.append({"records": [str(r) for r in config.records], "where": list(config.where), "base": base.name,
                    "knots_GFLOP": list(config.knots), "prior_weight": config.prior_weight,
                    "max_efficiency": config.max_efficiency, "system_out": str(target)},
                   {**result.parameters, "configurations": len(result.points), "parameter_sources": result.sources,
                    **{f"{row['phase']}_median_abs_error_pct": row["median_abs_error_pct"] for row in errors}})
    return CalibrateOutcome(result, measured, fitted, target, records.path)
