"""How many parameter tensors a pipeline stage holds: the optimizer and the gradient reduction launch about
one pass per tensor, so their per-kernel overheads scale with this count (evaluate.py, vectorized_terms.py,
calibrate.py)."""

from __future__ import annotations

from stepscope.spec import ModelSpec


def param_tensors(spec: ModelSpec, layers: int, embedding: bool, head: bool, moe_layers: int = 0) -> int:
    """Number of parameter tensors on a stage of `layers` dense and `moe_layers` MoE blocks (the optimizer
    launches about one pass per tensor; the local experts' weights as two grouped tensors, as Megatron-Core's
    GroupedMLP holds them)."""
    norm = 2 if spec.norm == "layer" else 1
    attention = 2 * (2 if spec.attn_bias else 1)
    mlp = 2 * (2 if spec.mlp_bias else 1)
    per_layer = 2 * norm + attention + mlp
    count = layers * per_layer
    if moe_layers:
        count += moe_layers * (2 * norm + attention + 1 + mlp + (mlp if spec.n_shared_experts else 0))
    if embedding:
        count += 1 + (spec.positions == "learned")
    if head:
        count += norm + (0 if spec.tie_embeddings else 1)
    return count
