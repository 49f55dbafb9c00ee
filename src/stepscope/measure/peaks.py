"""Published peak dense FLOP/s of common accelerators, for MFU (model FLOP/s / peak).

The table is `stepscope/data/accelerator_peaks.csv` (one row per accelerator, with its source), matched by whole
words of the device name, first match wins (so `H100 PCIe` is listed before `H100`, and `L4` is not `L40`). fp32
uses the TF32 tensor-core peak when PyTorch allows TF32 matmuls, else the plain fp32 peak. CPUs have no entry: stepscope
compares them with a measured GEMM rate instead (see gemm.py).
"""

from __future__ import annotations

import csv
import functools
import re
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a device is asked about: the trace analysis reads the table without it
    import torch


@functools.cache
def accelerator_peaks() -> list[dict[str, str]]:
    """The rows of the peaks table, in file order."""
    with resources.files("stepscope").joinpath("data/accelerator_peaks.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def published_peak(device_name: str, precision: str, tf32: bool) -> float | None:
    """Peak dense FLOP/s of the accelerator named `device_name` (as `torch.cuda.get_device_name` spells it) in
    `precision`, or None when the table has no entry."""
    tokens = _tokens(device_name)
    for row in accelerator_peaks():
        wanted = _tokens(row["name_contains"])
        # whole words in a row: `L4` is not `NVIDIA L40`, `H100` is `NVIDIA H100 80GB HBM3` and `H100-SXM`
        if any(tokens[i:i + len(wanted)] == wanted for i in range(len(tokens) - len(wanted) + 1)):
            column = "half" if precision in ("bf16", "fp16") else "tf32" if tf32 else "fp32"
            return float(row[f"{column}_TFLOPps"]) * 1e12
    return None


def _tokens(name: str) -> list[str]:
    return re.split(r"[\s\-_/]+", name.strip().upper())


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak dense FLOP/s for `precision` on `device`, or None when unknown (e.g. CPUs)."""
    import torch

    if device.type != "cuda":
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return published_peak(torch.cuda.get_device_name(device), precision, tf32)
