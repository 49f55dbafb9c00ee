"""`Workload`: what one training step processes (batch, sequence, precision, mode). Pure Python."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from stepscope.errors import UsageError

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Mode = Literal["fwd", "fwd-bwd", "train"]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
"""Precisions stepscope measures (PyTorch autocast)."""
MODELLED_PRECISIONS: tuple[str, ...] = (*PRECISIONS, "fp8")
"""Precisions the performance model predicts: fp8 is bf16 mixed precision whose linear-layer GEMMs run in fp8
(Transformer Engine, torchao float8); measuring it needs fp8 hardware."""
MODES: tuple[str, ...] = ("fwd", "fwd-bwd", "train")

_BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def bytes_per_element(precision: str) -> int:
    """Storage size of one value: fp32 4, bf16/fp16 2, fp8 1, ..."""
    try:
        return _BYTES_PER_ELEMENT[precision]
    except KeyError:
        raise UsageError(f"unknown precision {precision!r}; known: {', '.join(_BYTES_PER_ELEMENT)}") from None


@dataclass(frozen=True)
class Workload:
    """One training step's work: `batch` sequences of `seq` tokens, in `precision`, doing `mode`."""

    batch: int = 4
    """Sequences per step: of one process for `stepscope step`; the global batch in the performance model."""
    seq: int = 128
    """Tokens per sequence."""
    precision: Precision = "fp32"
    """fp32, or bf16/fp16 autocast (fp16 with loss scaling); fp8 (bf16 with fp8 GEMMs) in the model only."""
    mode: Mode = "train"
    """fwd (inference forward), fwd-bwd (forward + backward), train (forward + backward + AdamW step)."""

    def __post_init__(self) -> None:
        for name in ("batch", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        if self.precision not in MODELLED_PRECISIONS:
            raise UsageError(f"precision must be one of {'|'.join(MODELLED_PRECISIONS)}, got {self.precision!r}")
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {'|'.join(MODES)}, got {self.mode!r}")

    @property
    def tokens(self) -> int:
        """Tokens per step: batch x seq."""
        return self.batch * self.seq

    @property
    def phases(self) -> tuple[str, ...]:
        """The timed phases of one step in this mode."""
        return {"fwd": ("forward",), "fwd-bwd": ("forward", "backward"),
                "train": ("forward", "backward", "optimizer")}[self.mode]

    def check_fits(self, context_length: int) -> None:
        """UsageError when the sequence is longer than the model accepts."""
        if self.seq > context_length:
            raise UsageError(f"seq={self.seq} exceeds the model's context_length={context_length}")

    def to_dict(self) -> dict[str, Any]:
        """Every field (part of a record's config)."""
        return dataclasses.asdict(self)
