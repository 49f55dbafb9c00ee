"""A system fitted to measured op rates: the GPU's matrix, fused-attention and fp8 rates at the shapes a model runs.

`stepscope op-rates` times a model's own GEMMs (every pass), its causal attention per SDPA backend and its fp8
GEMMs on a GPU held at its power limit (`measure/op_rates/`), one `op-rates` record each. From such records (or
the JSON files of its first version, docs/measurements/) this derives, by one rule fixed before any prediction is
made with it:
- each `dense` GEMM's fraction of the peak, over its tile and wave quantization (`model/rates.tiling`), is
  η∞·K/(K + K0) (`model/rates.py`): a least-squares line through 1/η against 1/K gives η∞ (1/intercept) and K0
  (slope/intercept), per precision; rows that span one K only give the median and keep the base's K0;
- the efficiency curve's top = the bf16 η∞; every knot of the base curve is scaled by top / (the base curve's
  top), so its shape below stays the base's;
- `gemm_k0` = the fitted K0s scaled from the measured GPU to the base by their memory bandwidths (K0 is the
  output store of a tile against its main loop: ∝ compute rate / bandwidth, `spec.system.Accelerator.gemm_k0`);
- `flash_efficiency` = the cuDNN fused attention's FLOP-weighted rate (forward and backward rows pooled) over
  that top (the fraction of an equal-sized GEMM's efficiency the fused kernel reaches);
- `fp8_efficiency` = the fp8 η∞ over the bf16 η∞.
A FLOP-weighted rate for attention, whose forward and backward are different kernels of different sizes.
Fractions are of `--base`'s peaks. A part the files do not measure keeps the base's value and says so. The
shipped H100-SXM, H200 and H800 presets are this rule applied to `docs/measurements/` (a test checks it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.perfmodel.model.rates import tiling
from stepscope.perfmodel.runs import RunRecords
from stepscope.results.files import check_writable_file
from stepscope.results.store import read_records
from stepscope.spec.system import SystemSpec, list_systems, load_system, system_to_toml

ATTENTION_BACKEND = "cudnn"
"""The fused-attention kernel the presets describe: cuDNN's, Transformer Engine's default on Hopper."""


@dataclass(frozen=True)
class RatesCalibrationConfig:
    """Which op-rate files to read, the system they refine, and where the result goes."""

    rates: tuple[str, ...] = ()
    """`op-rates` records (folders or .jsonl files of `stepscope op-rates`), or JSON files of its first version."""
    base: str = "H100-SXM"
    """System preset or TOML the measured rates refine (its peaks, memory and network stay)."""
    system_out: str = "calibrated.toml"
    """Where the fitted system TOML is written."""
    name: str = ""
    """Name of the fitted system ("": the base's name)."""


@dataclass(frozen=True)
class RatesCalibration:
    """The fitted system and, per parameter, the base value, the fitted one and where it comes from."""

    system: SystemSpec
    base: SystemSpec
    rows: list[dict[str, Any]]
    system_out: Path
    path: Path | None = None


def read_rates(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Every measured row of the op-rates records (`stepscope op-rates`: a folder or its .jsonl file) or of the
    JSON files of its first version (`{"device", "rows": [...]}`, docs/measurements/); UsageError on a missing or
    malformed input."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        not_rates = UsageError(f"{path} is not an op-rates file (the records of `stepscope op-rates`)")
        found = _op_rates_records(path) if Path(path).is_dir() or Path(path).suffix == ".jsonl" else None
        if found is None:
            try:
                data = json.loads(Path(path).read_text(encoding="utf-8"))
                found = [{"device": data.get("device", ""), **row} for row in data["rows"]]
            except OSError as error:
                raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
            except (ValueError, KeyError, TypeError, AttributeError):
                raise not_rates from None
        for row in found:  # what the rule reads, as op_rates writes it
            numbers = [row.get("measured_TFLOPps"), row.get("flops")]
            if not (isinstance(row.get("family"), str) and isinstance(row.get("variant"), str)
                    and all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in numbers)):
                raise not_rates
        if not found:
            raise not_rates
        rows += found
    return rows


def _op_rates_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The measured rows of the `op-rates` records in `path`: config and metrics, and the device they ran on."""
    return [{"device": r["env"].get("device_name", ""), **r["config"], **r["metrics"]}
            for r in read_records(path) if r["kind"] == "op-rates" and r["status"] == "ok"]


def _k_law(rows: Sequence[dict[str, Any]], acc: Any) -> tuple[float, float | None, str]:
    """(η∞, K0 or None, how) of GEMM rows: 1/η = 1/η∞ + (K0/η∞)/K by least squares, η over tiling."""
    shaped = [r for r in rows if all(isinstance(r.get(x), int | float) for x in ("m", "n", "k"))]
    if len({r["k"] for r in shaped}) < 2:
        return float(median(r["measured_of_peak"] for r in rows)), None, f"median of {len(rows)} GEMMs"
    x = np.array([1.0 / r["k"] for r in shaped])
    y = np.array([tiling(acc, r["m"], r["n"], r.get("groups", 1)) / r["measured_of_peak"] for r in shaped])
    slope, intercept = np.polyfit(x, y, 1)
    return 1.0 / intercept, max(0.0, slope / intercept), f"1/eta against 1/K over {len(shaped)} GEMMs"


def _bandwidth_scale(rows: Sequence[dict[str, Any]], base: SystemSpec) -> tuple[float, str]:
    """The measured GPU's memory bandwidth over the base's (K0 moves with it), from the preset of its name."""
    devices = {r.get("device", "") for r in rows}
    for name in list_systems():
        measured = load_system(name).accelerator
        if devices == {measured.name}:
            return measured.memory_bytes_per_s / base.accelerator.memory_bytes_per_s, f"measured on {name}"
    return 1.0, "the measured GPU's bandwidth is unknown: K0 as measured"


def fitted_rates(rows: Sequence[dict[str, Any]], base: SystemSpec) -> tuple[SystemSpec, list[dict[str, Any]]]:
    """`base` with the curve top, GEMM K0s, flash and fp8 efficiencies the rows measure (the module's rule).
    Each row's fraction of the peak is taken against `base`'s peaks (fp8 GEMMs against its fp8 peak, the rest
    bf16), not the system the measuring run compared with."""
    acc = base.accelerator
    if any(r.get("variant") == "fp8" for r in rows) and "fp8" not in acc.matrix_TFLOPps:
        raise UsageError(f"the op-rate files hold fp8 GEMMs but {base.name} has no fp8 peak: wrong --base?")

    def of_peak(family: str, variant: str) -> list[dict[str, Any]]:
        peak = acc.matrix_peak("fp8" if variant == "fp8" else "bf16")
        return [{**r, "measured_of_peak": r["measured_TFLOPps"] * 1e12 / peak} for r in rows
                if r.get("family") == family and r.get("variant") == variant]

    bf16, fp8, attention = of_peak("dense", "bf16"), of_peak("dense", "fp8"), of_peak("attention", ATTENTION_BACKEND)
    if not bf16:
        raise UsageError("the op-rate files hold no dense bf16 GEMM rows: nothing to fit the curve to")
    base_top = acc.matrix_efficiency_by_GFLOP[-1][1]
    top, k0, how = _k_law(bf16, acc)
    scale, where = _bandwidth_scale(rows, base)
    knots = tuple((g, eta * top / base_top) for g, eta in acc.matrix_efficiency_by_GFLOP)
    gemm_k0 = dict(acc.gemm_k0)
    changes: dict[str, Any] = {"matrix_efficiency_by_GFLOP": knots}
    out = [{"parameter": "efficiency curve top", "base": base_top, "fitted": top,
            "source": f"bf16 eta_inf, {how} (knots scaled by {top / base_top:.4f})"}]
    for precision, k in (("bf16", k0),) + ((("fp8", _k_law(fp8, acc)[1]),) if fp8 else ()):
        if k is not None:
            gemm_k0[precision] = k * scale
        out.append({"parameter": f"gemm_k0 {precision}", "base": acc.gemm_k0.get(precision, 0.0),
                    "fitted": gemm_k0.get(precision, 0.0),
                    "source": f"{k:.0f} x {scale:.3f} ({where})" if k is not None else "kept: one K measured"})
    changes["gemm_k0"] = gemm_k0
    if attention:
        rate = sum(r["flops"] for r in attention) / sum(r["flops"] / r["measured_of_peak"] for r in attention)
        changes["flash_efficiency"] = rate / top
        out.append({"parameter": "flash_efficiency", "base": acc.flash_efficiency, "fitted": rate / top,
                    "source": f"{ATTENTION_BACKEND} attention at {rate:.3f} of the peak over {len(attention)} rows"})
    else:
        out.append({"parameter": "flash_efficiency", "base": acc.flash_efficiency, "fitted": acc.flash_efficiency,
                    "source": f"kept: no {ATTENTION_BACKEND} attention rows"})
    if fp8:
        ratio = _k_law(fp8, acc)[0] / top
        changes["fp8_efficiency"] = min(1.0, ratio)
        out.append({"parameter": "fp8_efficiency", "base": acc.fp8_efficiency, "fitted": min(1.0, ratio),
                    "source": f"fp8 eta_inf over the bf16 eta_inf ({len(fp8)} fp8 GEMMs)"})
    else:
        out.append({"parameter": "fp8_efficiency", "base": acc.fp8_efficiency, "fitted": acc.fp8_efficiency,
                    "source": "kept: no fp8 GEMM rows"})
    return dataclasses.replace(base, accelerator=dataclasses.replace(acc, **changes)), out


def run_calibrate_rates(config: RatesCalibrationConfig, out: str | os.PathLike | None = None) -> RatesCalibration:
    """Fit `config.base` to the op-rate files, write the system TOML and append one `calibrate-rates` record."""
    if not config.rates:
        raise UsageError("--rates needs at least one op-rates records folder or file")
    base = load_system(config.base)
    system, rows = fitted_rates(read_rates(config.rates), base)  # inputs first: a bad file creates no output
    target = check_writable_file(config.system_out, "the system")
    records = RunRecords(out, "calibrate-rates")
    if config.name:
        system = dataclasses.replace(system, name=config.name)
    header = f"stepscope calibrate --rates {' '.join(map(str, config.rates))} --base {config.base}"
    try:
        target.write_text(system_to_toml(system, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    records.append({"rates": list(config.rates), "base": base.name, "system_out": str(target)},
                   {row["parameter"].replace(" ", "_"): row["fitted"] for row in rows})
    return RatesCalibration(system, base, rows, target, records.path)
