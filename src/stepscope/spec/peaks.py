"""Published dense matrix peaks of accelerators: the one table behind MFU, a trace's roofline and the matrix rates of
the shipped system presets.

The table is `stepscope/data/accelerator_peaks.csv` (one row per accelerator, with its source), matched by whole
words of the device name, first match wins (so `H100 PCIe` is listed before `H100`, and `L4` is not `L40`). A
system preset whose `[accelerator]` has no `matrix_TFLOPps` takes the row of its accelerator's name
(`published_matrix_TFLOPps`), so a peak is written once. CPUs have no row: their rates are measured. Pure Python.
"""

from __future__ import annotations

import csv
import functools
import re
from importlib import resources

COLUMNS = {"bf16": "half", "fp16": "half", "tf32": "tf32", "fp32": "fp32", "fp8": "fp8"}
"""Precision -> the table's column (`<column>_TFLOPps`; an empty cell: no such rate)."""


@functools.cache
def accelerator_peaks() -> list[dict[str, str]]:
    """The rows of the peaks table, in file order."""
    with resources.files("stepscope").joinpath("data/accelerator_peaks.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def peaks_row(device_name: str) -> dict[str, str] | None:
    """The first row whose `name_contains` words appear, in order and whole, in `device_name`."""
    tokens = _tokens(device_name)
    for row in accelerator_peaks():
        wanted = _tokens(row["name_contains"])
        # whole words in a row: `L4` is not `NVIDIA L40`, `H100` is `NVIDIA H100 80GB HBM3` and `H100-SXM`
        if any(tokens[i:i + len(wanted)] == wanted for i in range(len(tokens) - len(wanted) + 1)):
            return row
    return None


def published_matrix_TFLOPps(device_name: str) -> dict[str, float] | None:
    """The dense matrix peak per precision of `device_name` (fp32: without TF32), or None when the table has no
    row for it."""
    row = peaks_row(device_name)
    if row is None:
        return None
    return {p: float(row[f"{c}_TFLOPps"]) for p, c in COLUMNS.items() if row[f"{c}_TFLOPps"].strip()}


def published_peak(device_name: str, precision: str, tf32: bool) -> float | None:
    """Peak dense FLOP/s of the accelerator named `device_name` (as `torch.cuda.get_device_name` spells it) in
    `precision` (fp32: the TF32 peak when `tf32`), or None when the table has no entry."""
    rates = published_matrix_TFLOPps(device_name) or {}
    rate = rates.get("tf32" if precision == "fp32" and tf32 else precision)
    return None if rate is None else rate * 1e12


def _tokens(name: str) -> list[str]:
    return re.split(r"[\s\-_/]+", name.strip().upper())
