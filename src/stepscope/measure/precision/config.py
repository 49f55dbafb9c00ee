"""The settings of the two precision experiments: torch-free, so the command line reads their defaults without
importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.spec import ModelSpec


@dataclass(frozen=True)
class AccumulateConfig:
    """`increment` added `steps` times in several accumulator dtypes (the exact sum is steps x increment)."""

    steps: int = 1000
    """Additions."""
    increment: float = 0.01
    """The value added each time (0.01 is not exact in any binary format)."""


@dataclass(frozen=True)
class DtypesConfig:
    """One forward and backward under autocast, with the dtype every module sees."""

    model: ModelSpec | None = None
    """A TransformerLM of this spec, or None for the textbook toy model (Linear, ReLU, LayerNorm, Linear)."""
    precision: str = "bf16"
    """The autocast dtype: bf16 or fp16."""
    device: str = "auto"
    """auto, cpu or cuda."""

    @property
    def model_name(self) -> str:
        return "toy" if self.model is None else self.model.name
