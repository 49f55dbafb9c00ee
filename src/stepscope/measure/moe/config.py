"""The point of an MoE-against-dense benchmark (`MoEDenseConfig`): torch-free, so the command line reads its
defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.measure.step.config import StepConfig
from stepscope.spec import ModelSpec

PIECES = ("router", "permute", "experts", "combine", "shared")
"""The MoE block's pieces, in the order a token meets them (the `stepscope.moe.<range>` ranges of `profile`:
router, dispatch, experts, combine, shared); `shared` only for models with shared experts."""
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 5e-2}
"""Largest accepted |grouped - reference| / max |reference| of the block's output and gradients, per precision:
fp32 sums in another order differ by about 1e-6 (tests hold 1e-5); a wrong permutation differs by order 1."""


def dense_equivalent(spec: ModelSpec) -> ModelSpec:
    """The dense model with the MoE model's activated FLOPs: every MoE block's routed and shared experts become
    one MLP of width (experts_per_token + n_shared_experts) x expert_d_ff; the router's d_model x n_experts
    scores are the only activated FLOPs it lacks. Blocks `dense_layers` keep spec.d_ff only when it equals that
    width (else the comparison says so: `MoEDenseConfig.flops_ratio`)."""
    width = (spec.experts_per_token + spec.n_shared_experts) * spec.expert_d_ff
    return spec.replace(n_experts=0, n_shared_experts=0, dense_layers=0, capacity_factor=0.0, expert_groups=0,
                        groups_per_token=0, router="softmax", d_ff=width, expert_d_ff=width,
                        name=f"{spec.name}-dense-d_ff{width}")


@dataclass(frozen=True)
class MoEDenseConfig:
    """An MoE model's training step timed beside the dense model of equal activated FLOPs, and its MoE block timed
    piece by piece, all in one interleaved run."""

    step: StepConfig
    """The MoE model's step as `stepscope step` runs it: model, workload (the block is timed on its
    batch x seq tokens, forward and, unless mode is fwd, backward), device, compile, seed, `moe_impl` of the step;
    `warmup` and `iters` are rounds, every candidate running once per round."""

    @property
    def dense(self) -> ModelSpec:
        return dense_equivalent(self.step.model)

    @property
    def flops_ratio(self) -> float:
        """Activated FLOPs of the MoE step over the dense step's (the model's formula): 1 + the router's share."""
        seq = self.step.workload.seq
        return self.step.model.forward_flops_per_token(seq) / self.dense.forward_flops_per_token(seq)

    def validate(self) -> None:
        """Everything that can be checked before building anything (raises UsageError)."""
        if not self.step.model.is_moe:
            raise UsageError(f"--vs-dense compares an MoE model with its dense equivalent; {self.step.model.name} "
                             "has no experts (n_experts 0)")
        self.step.validate()

    def record_config(self) -> dict[str, Any]:
        config = self.step.record_config()
        config["dense_d_ff"] = self.dense.d_ff
        return config
