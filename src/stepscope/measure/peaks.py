"""The peak dense FLOP/s of the device a benchmark runs on, for MFU (model FLOP/s / peak).

The published table is `stepscope.spec.peaks`. fp32 uses the TF32 tensor-core peak when PyTorch allows TF32
matmuls, else the plain fp32 peak. CPUs have no entry: stepscope compares them with a measured GEMM rate instead
(see gemm.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.spec.peaks import published_peak

if TYPE_CHECKING:
    import torch


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak dense FLOP/s for `precision` on `device`, or None when unknown (e.g. CPUs)."""
    import torch

    if device.type != "cuda":
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return published_peak(torch.cuda.get_device_name(device), precision, tf32)
