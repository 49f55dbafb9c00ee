"""The point of a profile (`ProfileConfig`) and the profile command's defaults: torch-free, so the command line
reads them without importing torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.measure.step.config import StepConfig

TABLE_KINDS = ("profile-category", "profile-op", "profile-share", "profile-timer", "profile-attention",
               "profile-moe")
"""Record kinds of a point's tables (`profile-attention` only for naive attention, `profile-moe` only for MoE
models); `profile` is its summary."""
STEP_WARMUP = 1
"""The step's `warmup` when the command line gives none: steps the profiler records, then discards."""
STEP_ITERS = 3
"""The step's `iters` when the command line gives none: steps timed afterwards without the profiler."""


@dataclass(frozen=True)
class ProfileConfig:
    """One point of a profile."""

    step: StepConfig
    """The step to profile, as `stepscope step` runs it; its `warmup` is the profiler's warm-up steps
    (run and recorded, then discarded) and its `iters` the steps timed afterwards without the profiler."""
    wait: int = 0
    """Steps run before the profiler's warm-up, with the profiler idle."""
    active: int = 2
    """Steps recorded and analysed (tables are per step: sums divided by this)."""
    top: int = 10
    """Rows of the top-ops tables."""
    nvtx: bool = False
    """Also mark phases and steps with NVTX ranges (CUDA only) for Nsight Systems."""

    def validate(self) -> None:
        """Everything that can be checked before building anything (raises UsageError)."""
        from stepscope.measure.device import resolve_device

        self.step.validate()
        if self.wait < 0 or self.active <= 0 or self.top <= 0:
            raise UsageError(f"need wait >= 0, active > 0 and top > 0, got wait={self.wait} "
                             f"active={self.active} top={self.top}")
        if self.nvtx and resolve_device(self.step.device).type != "cuda":
            raise UsageError("--nvtx needs a CUDA device (NVTX ranges are for Nsight Systems)")

    def record_config(self) -> dict[str, Any]:
        config = self.step.record_config()
        config.update({k: v for k, v in dataclasses.asdict(self).items() if k != "step"})
        return config
