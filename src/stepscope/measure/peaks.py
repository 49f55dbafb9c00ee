"""Published peak dense FLOP/s of common accelerators, for MFU (model FLOP/s / peak).

The table is `stepscope/data/accelerator_peaks.csv` (one row per accelerator, with its source), matched by a
substring of the device name, first match wins (so `H100 PCIe` is listed before `H100`). fp32 uses the TF32
tensor-core peak when PyTorch allows TF32 matmuls, else the plain fp32 peak. CPUs have no entry: stepscope
compares them with a measured GEMM rate instead (see gemm.py).
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

import torch


@functools.cache
def accelerator_peaks() -> list[dict[str, str]]:
    """The rows of the peaks table, in file order."""
    with resources.files("stepscope").joinpath("data/accelerator_peaks.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def published_peak(device_name: str, precision: str, tf32: bool) -> float | None:
    """Peak dense FLOP/s of the accelerator named `device_name` (as `torch.cuda.get_device_name` spells it) in
    `precision`, or None when the table has no entry."""
    for row in accelerator_peaks():
        if row["name_contains"] in device_name:
            column = "half" if precision in ("bf16", "fp16") else "tf32" if tf32 else "fp32"
            return float(row[f"{column}_TFLOPps"]) * 1e12
    return None


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak dense FLOP/s for `precision` on `device`, or None when unknown (e.g. CPUs)."""
    if device.type != "cuda":
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return published_peak(torch.cuda.get_device_name(device), precision, tf32)
