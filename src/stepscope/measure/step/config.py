"""The point of a step benchmark (`StepConfig`): torch-free, so the command line reads its defaults without
importing torch; checking it against this machine (`validate`) imports torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec import ModelSpec, Workload


@dataclass(frozen=True)
class StepConfig:
    """One point of a step benchmark."""

    model: ModelSpec
    """The model to build (preset plus overrides)."""
    workload: Workload = field(default_factory=Workload)
    """Batch, sequence length, precision and mode."""
    attention: str = "sdpa"
    """Attention backend name (see `stepscope.nn.attention_backends()`)."""
    device: str = "auto"
    """auto, cpu or cuda."""
    compile: bool = False
    """Wrap the model in torch.compile (compile time is reported apart and excluded)."""
    warmup: int = 5
    """Untimed steps before measuring."""
    iters: int = 10
    """Timed steps."""
    threads: int | None = None
    """CPU intra-op threads (None: PyTorch's default)."""
    seed: int = 0
    """Seed for weights and the random batch."""
    moe_impl: str = "grouped"
    """Routed-expert implementation of an MoE model: grouped (the fast path, docs/moe.md) or reference (a loop)."""

    def validate(self) -> None:
        """Everything that can be checked before building anything (raises UsageError)."""
        from stepscope.measure.device import check_precision, dtype_of, resolve_device
        from stepscope.nn.attention import unsupported_reason

        self.workload.check_fits(self.model.context_length)
        device = resolve_device(self.device)
        check_precision(device, self.workload.precision)
        # a backend that cannot run here (flash-triton without GPU or interpreter, bf16 under the
        # interpreter, an unsupported head_dim) is refused now, not after other points were measured
        reason = unsupported_reason(self.attention, device, dtype_of(self.workload.precision), self.model.head_dim)
        if reason:
            raise UsageError(reason)
        from stepscope.nn.moe import check_impl

        check_impl(self.moe_impl)
        if self.warmup < 0 or self.iters <= 0:
            raise UsageError(f"need warmup >= 0 and iters > 0, got warmup={self.warmup} iters={self.iters}")

    def record_config(self) -> dict[str, Any]:
        config = {"model": self.model.name, **self.workload.to_dict()}
        config.update({k: v for k, v in dataclasses.asdict(self).items() if k not in ("model", "workload")})
        config["model_spec"] = self.model.to_dict()
        if not self.model.is_moe:  # dense records stay as they were (and --resume still finds them)
            del config["moe_impl"]
        return config
