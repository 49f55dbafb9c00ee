"""Published peak dense FLOP/s of common accelerators, for MFU (model FLOP/s / peak).

Matched by a substring of the device name. fp32 uses the TF32 tensor-core peak when PyTorch allows
TF32 matmuls, else the plain fp32 peak. CPUs have no entry: stepscope compares them with a measured
GEMM rate instead (see gemm.py).
"""

from __future__ import annotations

import torch

# name substring -> (bf16/fp16 dense tensor TFLOP/s, tf32 TFLOP/s, fp32 non-tensor TFLOP/s)
_PEAKS_TFLOPS: list[tuple[str, tuple[float, float, float]]] = [
    ("B200", (2250.0, 1100.0, 75.0)),
    ("H200", (989.0, 494.0, 67.0)),
    ("H100 PCIe", (756.0, 378.0, 51.0)),
    ("H100", (989.0, 494.0, 67.0)),
    ("A100", (312.0, 156.0, 19.5)),
    ("L40S", (362.0, 183.0, 91.6)),
    ("L4", (121.0, 60.0, 30.3)),
    ("A10G", (70.0, 35.0, 31.2)),
    ("A10", (125.0, 62.5, 31.2)),
    ("RTX 4090", (165.0, 82.6, 82.6)),
    ("V100", (125.0, 15.7, 15.7)),
    ("MI300X", (1307.0, 654.0, 163.4)),
]


def peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak dense FLOP/s for `precision` on `device`, or None when unknown (e.g. CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for pattern, (half, tf32, fp32) in _PEAKS_TFLOPS:
        if pattern in name:
            if precision in ("bf16", "fp16"):
                return half * 1e12
            tf32_on = torch.get_float32_matmul_precision() != "highest"
            return (tf32 if tf32_on else fp32) * 1e12
    return None
