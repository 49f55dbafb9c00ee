"""The point of a memory measurement (`MemoryConfig`) and the memory command's defaults: torch-free, so the
command line reads them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.measure.step.config import StepConfig

TABLE_KINDS = ("memory-phase", "memory-alloc")
"""Record kinds of a point's tables; `memory` is its summary."""
DEFAULT_MODES = ("fwd", "train")
"""The modes measured when the command line gives none: inference, and the whole train step."""
STEP_WARMUP = 1
"""Full steps before the measured one when the command line gives none (1: AdamW's state exists by then)."""


@dataclass(frozen=True)
class MemoryConfig:
    """One point of a memory measurement."""

    step: StepConfig
    """The step to measure, as `stepscope step` runs it; its `warmup` is the number of full steps before
    the measured one (1 lets AdamW allocate its state first); its `iters` is not used (one step)."""
    top: int = 10
    """Rows of the largest-allocations table."""

    def validate(self) -> None:
        self.step.validate()
        if self.top <= 0:
            raise UsageError(f"need top > 0, got {self.top}")

    def record_config(self) -> dict[str, Any]:
        config = self.step.record_config()
        config.pop("iters", None)
        config["top"] = self.top
        return config
