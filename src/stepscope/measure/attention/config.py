"""The points and settings of the attention benchmark (`AttentionBenchConfig`) and its correctness tolerances:
torch-free, so the command line reads its defaults without importing torch; `validate` imports it."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepscope.errors import UsageError

if TYPE_CHECKING:
    import torch

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
"""Largest accepted relative error (max |x − ref| / max |ref|, against fp64) per input dtype: the sanity
gate for PyTorch's own implementations (naive, sdpa, compiled)."""
OWN_IMPLS = ("flash-torch", "flash-triton")
"""stepscope's implementations: in fp16/bf16 each error must stay within 2x the error of PyTorch's own
attention (SDPA) in the same dtype on the same inputs, both against fp64 (the project's rule)."""


@dataclass(frozen=True)
class AttentionPoint:
    """One problem every implementation solves: q, k, v of shape (batch, heads, seq, dim)."""

    batch: int
    heads: int
    seq: int
    dim: int
    dtype: str
    causal: bool

    @property
    def batch_heads(self) -> int:
        return self.batch * self.heads

    def label(self) -> str:
        return (f"batch {self.batch} heads {self.heads} seq {self.seq} dim {self.dim} {self.dtype}"
                + (" causal" if self.causal else ""))


@dataclass(frozen=True)
class AttentionBenchConfig:
    """A sweep: the cartesian product of the listed sizes, each point run by every implementation."""

    impls: tuple[str, ...] = ("naive", "sdpa", "flash-torch")
    """Implementations to compare (the attention backends of `stepscope.nn.attention`)."""
    batch: tuple[int, ...] = (8,)
    """Batch sizes."""
    heads: tuple[int, ...] = (1,)
    """Heads per sequence."""
    seq: tuple[int, ...] = (1024,)
    """Sequence lengths (queries = keys)."""
    dim: tuple[int, ...] = (64,)
    """Head dimensions."""
    dtype: tuple[str, ...] = ("fp32",)
    """Input dtypes: fp32, bf16, fp16."""
    causal: tuple[bool, ...] = (False,)
    """Causal mask (top-left aligned) or none."""
    passes: tuple[str, ...] = ("fwd", "bwd", "fwd-bwd")
    """What to time: fwd, bwd (after an untimed forward), fwd-bwd."""
    device: str = "auto"
    """auto, cpu or cuda."""
    warmup: int = 1
    """Untimed rounds after the correctness and memory runs (which warm up too)."""
    iters: int = 5
    """Timed rounds (every implementation runs once per round)."""
    threads: int | None = None
    """CPU intra-op threads (None: PyTorch's default)."""
    check_rows: int = 256
    """Query rows checked against fp64 when seq is longer (all rows otherwise)."""
    startup_s: float = 1.0
    """Seconds of warm-up on a tiny problem before the first point (a process's first seconds are slow)."""
    seed: int = 0
    """Seed of the random q, k, v and dO."""
    grid: str | None = None
    """Name of the preset this sweep came from, if any."""

    def points(self) -> list[AttentionPoint]:
        return [AttentionPoint(*values) for values in itertools.product(
            self.batch, self.heads, self.seq, self.dim, self.dtype, self.causal)]

    @property
    def needs_backward(self) -> bool:
        return any(p in ("bwd", "fwd-bwd") for p in self.passes)

    def validate(self) -> torch.device:
        """Check everything before any work (UsageError); returns the device."""
        from stepscope.measure.device import resolve_device
        from stepscope.nn.attention import attention_backends, unsupported_reason
        from stepscope.nn.attention_reference import PASSES

        device = resolve_device(self.device)
        for name, values in (("impls", self.impls), ("batch", self.batch), ("heads", self.heads), ("seq", self.seq),
                             ("dim", self.dim), ("dtype", self.dtype), ("causal", self.causal),
                             ("passes", self.passes)):
            if not values:
                raise UsageError(f"attention benchmark needs at least one value for {name}")
        for name in ("batch", "heads", "seq", "dim"):
            bad = [v for v in getattr(self, name) if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
            if bad:
                raise UsageError(f"{name} must be positive integers, got {bad[0]!r}")
        for impl in self.impls:
            if impl not in attention_backends():
                raise UsageError(f"unknown implementation {impl!r}; choose from {', '.join(attention_backends())}")
            problem = unsupported_reason(impl, device)  # unusable on this machine whatever the point
            if problem:
                raise UsageError(problem)
        for dtype in self.dtype:
            if dtype not in TOLERANCE:
                raise UsageError(f"invalid dtype {dtype!r} (choose from {', '.join(TOLERANCE)})")
        for pass_ in self.passes:
            if pass_ not in PASSES:
                raise UsageError(f"invalid pass {pass_!r} (choose from {', '.join(PASSES)})")
        if self.warmup < 0 or self.iters <= 0 or self.check_rows <= 0 or self.startup_s < 0:
            raise UsageError(f"need warmup >= 0, iters > 0, check_rows > 0 and startup_s >= 0, got {self.warmup}, "
                             f"{self.iters}, {self.check_rows}, {self.startup_s}")
        if self.threads is not None and self.threads <= 0:
            raise UsageError(f"threads must be positive, got {self.threads}")
        return device

    def record_config(self, point: AttentionPoint, impl: str) -> dict[str, Any]:
        """The record's configuration (also its resume key)."""
        return {"impl": impl, **dataclasses.asdict(point), "passes": list(self.passes), "device": self.device,
                "warmup": self.warmup, "iters": self.iters, "threads": self.threads, "check_rows": self.check_rows,
                "seed": self.seed, "grid": self.grid}
