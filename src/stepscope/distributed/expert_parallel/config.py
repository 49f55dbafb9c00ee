"""The point of an expert-parallel benchmark (`EPConfig`): torch-free, so the command line reads its defaults
without importing torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec import ModelSpec, get_preset


@dataclass(frozen=True)
class EPConfig:
    """One MoE layer run expert-parallel over `ep` ranks."""

    model: ModelSpec = field(default_factory=lambda: get_preset("tiny-moe"))
    """The model whose MoE block is run (its router, experts, capacity factor and shared experts)."""
    ep: int = 2
    """Expert-parallel ranks: each owns n_experts / ep routed experts."""
    tokens: int = 2048
    """Tokens per rank per step (batch x seq of one rank)."""
    warmup: int = 2
    """Untimed layer calls before timing."""
    iters: int = 10
    """Timed layer calls."""
    backend: str = "gloo"
    """Process-group backend: gloo (CPU) or nccl (one GPU per rank)."""
    timeout_s: float = 60.0
    """A rank blocked this long on a peer raises instead of waiting forever."""
    threads: int | None = None
    """Intra-op CPU threads per rank (None: usable cores / ranks)."""
    seed: int = 0
    """Seed of the weights (the same on every rank) and of each rank's tokens (seed, rank)."""

    def validate(self) -> None:
        if not self.model.is_moe:
            raise UsageError(f"model {self.model.name} has no experts (n_experts 0): choose an MoE preset")
        if self.ep < 1 or self.model.n_experts % self.ep:
            raise UsageError(f"--ep {self.ep} must divide n_experts={self.model.n_experts}")
        if self.tokens < 1 or self.warmup < 0 or self.iters < 1:
            raise UsageError(f"need tokens >= 1, warmup >= 0 and iters >= 1, got tokens={self.tokens} "
                             f"warmup={self.warmup} iters={self.iters}")

    def record_config(self) -> dict[str, Any]:
        config = {"model": self.model.name}
        config.update({k: v for k, v in dataclasses.asdict(self).items() if k != "model"})
        config["model_spec"] = self.model.to_dict()
        return config
