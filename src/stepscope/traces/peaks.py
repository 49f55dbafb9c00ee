"""The peak rates a trace's device is measured against: its matrix FLOP/s per precision and its memory bandwidth.

In order: the system given (`--system`: a preset or a TOML file, its `matrix_TFLOPps` and `hbm_GBps`); the shipped
system preset whose accelerator has exactly the trace's device name (`deviceProperties[0].name`, e.g. `NVIDIA H100
80GB HBM3` is H100-SXM); the published table of dense peaks (`spec.peaks`, whole-word match, no
bandwidth). fp32 GEMMs run on TF32 tensor cores when their kernel says so (`tf32`, or CUTLASS's `s1688` / `s16816`
shapes): then the TF32 peak is the reference.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

TF32_KERNEL = re.compile(r"tf32|s1688|s16816", re.IGNORECASE)


@dataclass(frozen=True)
class DevicePeaks:
    """Peak matrix FLOP/s per precision and memory bytes/s (None: unknown) of one device."""

    name: str
    matrix: dict[str, float] = field(default_factory=dict)
    bandwidth: float | None = None
    source: str = "unknown device: no peaks (name one with --system)"

    def matrix_peak(self, precision: str) -> float | None:
        return self.matrix.get(precision)


def device_peaks(device_name: str, system: str | None = None) -> DevicePeaks:
    """The peaks of `device_name` (see the module docstring); `system` (preset or TOML) wins when given."""
    from stepscope.spec.system import load_system

    if system:
        spec = load_system(system)
        return _from_system(spec, f"system {spec.name}")
    return _preset_peaks(device_name)


@functools.lru_cache(maxsize=64)
def _preset_peaks(device_name: str) -> DevicePeaks:
    """The peaks of the preset of that device name, else the published table's (once per device name and process,
    not once per rank file)."""
    from stepscope.spec.system import load_system, preset_of_device

    preset = preset_of_device(device_name)
    if preset is not None:
        spec = load_system(preset)
        return _from_system(spec, f"preset {spec.name} (same device name)")
    from stepscope.spec.peaks import published_matrix_TFLOPps

    rates = published_matrix_TFLOPps(device_name)
    if not rates:
        return DevicePeaks(device_name)
    rates = {p: r * 1e12 for p, r in rates.items()}
    return DevicePeaks(device_name, rates, None, "accelerator_peaks.csv (no bandwidth: name a --system for GB/s)")


def _from_system(spec, source: str) -> DevicePeaks:
    acc = spec.accelerator
    return DevicePeaks(acc.name, {p: v * 1e12 for p, v in acc.matrix_TFLOPps.items()}, acc.hbm_GBps * 1e9, source)


def gemm_precision(precision: str, kernel_names: list[str]) -> str:
    """`tf32` for an fp32 GEMM whose kernels run on TF32 tensor cores, else `precision`."""
    if precision == "fp32" and any(TF32_KERNEL.search(name) for name in kernel_names):
        return "tf32"
    return precision


def check_system(system: str | None) -> None:
    """UsageError for a --system that does not load (before any trace is read)."""
    if system:
        from stepscope.spec.system import load_system

        load_system(system)
