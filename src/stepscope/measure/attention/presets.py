"""Named sweeps of `stepscope attention --grid NAME`: two well-known experiments, and their CPU scaling.

- naive-sweep: naive attention against the fused kernels at batch 8 with one head, head_dim 16–128,
  sequence 256–16384, forward and backward timed apart, no mask. The point of the original experiment
  is memory: naive attention keeps B·N² scores and probabilities for backward (8 GiB per tensor at
  N = 16384 in fp32), so its long-sequence points end as `oom` rows while the flash kernels go on.
- flash-sweep: batch 1, causal, sequence 128–65536 in powers of two, head_dim 16–128, bf16 and fp32,
  forward, backward and end-to-end, the benchmark of a Triton FlashAttention-2 against PyTorch.
- gpu-goal: the one shape of the H100 target (q, k, v = (16, 16384, 64), bf16, causal, forward+backward
  in <= 5.4 ms), flash-triton beside SDPA; on a CPU the issue's CPU target instead (batch·heads 8,
  N 4096, d 64, fp32, causal, fwd+bwd: flash-torch beside SDPA and naive).

On a CPU the same experiments are scaled down so that a default run finishes in a few minutes on a
2-core machine: sequences up to 4096 (naive-sweep, batch 8) and 8192 (flash-sweep, batch 1), 1 untimed
and 5 timed rounds, and `flash-torch` in place of `flash-triton`. `compiled` is in neither (torch.compile
takes 10-20 s per shape on such a CPU; add it with --impl). Options given on the command line override
the preset's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepscope.errors import UsageError


@dataclass(frozen=True)
class GridPreset:
    """A named sweep: the published sizes (GPU) and a CPU-scaled version of the same experiment."""

    description: str
    """One line shown by `stepscope attention --help`."""
    gpu: dict[str, Any] = field(default_factory=dict)
    """AttentionBenchConfig fields on a CUDA device."""
    cpu: dict[str, Any] = field(default_factory=dict)
    """AttentionBenchConfig fields on a CPU."""


_D = (16, 32, 64, 128)

PRESETS: dict[str, GridPreset] = {
    "naive-sweep": GridPreset(
        description="batch 8, 1 head, no mask, d 16-128, seq 256-16384 (CPU: -4096), fwd and bwd",
        gpu=dict(impls=("naive", "sdpa", "flash-torch", "flash-triton"), batch=(8,), heads=(1,), dim=_D,
                 seq=(256, 1024, 4096, 8192, 16384), dtype=("fp32",), causal=(False,), passes=("fwd", "bwd"),
                 warmup=3, iters=20),
        cpu=dict(impls=("naive", "sdpa", "flash-torch"), batch=(8,), heads=(1,), dim=_D, seq=(256, 1024, 4096),
                 dtype=("fp32",), causal=(False,), passes=("fwd", "bwd"), warmup=1, iters=5),
    ),
    "flash-sweep": GridPreset(
        description="batch 1, causal, seq 128-65536 (CPU: -8192), d 16-128, bf16 and fp32, fwd/bwd/fwd-bwd",
        gpu=dict(impls=("naive", "sdpa", "flash-triton"), batch=(1,), heads=(1,), dim=_D,
                 seq=tuple(2 ** i for i in range(7, 17)), dtype=("bf16", "fp32"), causal=(True,),
                 passes=("fwd", "bwd", "fwd-bwd"), warmup=3, iters=20),
        cpu=dict(impls=("naive", "sdpa", "flash-torch"), batch=(1,), heads=(1,), dim=_D,
                 seq=tuple(2 ** i for i in range(7, 14)), dtype=("bf16", "fp32"), causal=(True,),
                 passes=("fwd", "bwd", "fwd-bwd"), warmup=1, iters=5),
    ),
    "gpu-goal": GridPreset(
        description="the speed targets: GPU (16, 16384, 64) bf16 causal fwd+bwd; CPU 8 x 4096 x 64 fp32",
        # each round synchronizes before reading the clock: for a ~5 ms call that is within ~1% of
        # triton.testing.do_bench, which docs/attention.md shows for the exact published measurement
        gpu=dict(impls=("sdpa", "flash-triton"), batch=(16,), heads=(1,), dim=(64,), seq=(16384,),
                 dtype=("bf16",), causal=(True,), passes=("fwd-bwd",), warmup=25, iters=100),
        cpu=dict(impls=("naive", "sdpa", "flash-torch"), batch=(8,), heads=(1,), dim=(64,), seq=(4096,),
                 dtype=("fp32",), causal=(True,), passes=("fwd-bwd",), warmup=1, iters=10),
    ),
}


def preset_fields(name: str, device_type: str) -> dict[str, Any]:
    """The preset's AttentionBenchConfig fields for a `cuda` or `cpu` device."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown grid {name!r}; known: {', '.join(PRESETS)}") from None
    return dict(preset.gpu if device_type == "cuda" else preset.cpu, grid=name)
