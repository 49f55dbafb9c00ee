"""The parameter tensors of a pipeline stage: how many (the optimizer and the gradient reduction launch about one
pass per tensor, so their per-kernel overheads scale with this count: `terms.py`, calibrate), and the gradients
one GPU reduces, tensor by tensor (what the DDP bucket planner takes: `predict --buckets`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.layout import geometry
from stepscope.perfmodel.model.op_types import Op
from stepscope.perfmodel.model.ops import activation_precision, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.model.ops_moe import moe_layer_ops
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan


def param_tensors(spec: ModelSpec, layers: Any, embedding: Any, head: Any, moe_layers: Any = 0) -> Any:
    """Number of parameter tensors on a stage of `layers` dense and `moe_layers` MoE blocks (the optimizer
    launches about one pass per tensor; the local experts' weights as two grouped tensors, as Megatron-Core's
    GroupedMLP holds them). Ints and bools, or arrays of them."""
    norm = 2 if spec.norm == "layer" else 1
    attention = 2 * (2 if spec.attn_bias else 1)
    mlp = 2 * (2 if spec.mlp_bias else 1)
    per_layer = 2 * norm + attention + mlp
    per_moe_layer = 2 * norm + attention + 1 + mlp + (mlp if spec.n_shared_experts else 0)
    return (layers * per_layer + moe_layers * per_moe_layer + embedding * (1 + (spec.positions == "learned"))
            + head * (norm + (0 if spec.tie_embeddings else 1)))


def gradient_tensors(spec: ModelSpec, workload: Workload, plan: ParallelPlan) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of the gradients one GPU's data-parallel reduction carries, in parameter
    registration order, for the pipeline stage holding the most parameters: the input the DDP bucket
    planner (`stepscope.spec.buckets.plan_buckets`) takes. One entry per op (its weight and bias)."""
    c = Candidates.from_plans([plan])
    g = geometry(c, workload, plan.flash_attention)
    dtype = "fp32" if plan.fp32_grads or workload.precision == "fp32" else activation_precision(workload.precision)
    dense_ops = layer_ops(spec, g)
    moe_ops = moe_layer_ops(spec, g) if spec.is_moe else []
    if plan.experts_apart:  # expert gradients go to their own (expert-data-parallel) reduction
        moe_ops = [op for op in moe_ops if not op.expert]

    def entries(ops: Sequence[Op], prefix: str) -> list[tuple[str, int, str]]:
        counts = [(op.name, round(float(np.asarray(op.params).reshape(-1)[0]))) for op in ops]
        return [(f"{prefix}{name}", n, dtype) for name, n in counts if n > 0]

    dense_layers = spec.dense_layers if spec.is_moe else None

    def blocks(layers: int, leading: bool) -> list[tuple[str, int, str]]:
        dense = layers if dense_layers is None else (min(dense_layers, layers) if leading else 0)
        return [e for i in range(layers) for e in entries(dense_ops if i < dense else moe_ops, f"blocks.{i}.")]

    first, middle, last = plan.stage_layers(spec.n_layers)
    head = entries(head_ops(spec, g), "")
    front = entries(embedding_ops(spec, g), "") + blocks(first, True)
    if plan.pp == 1:
        return front + head
    back = blocks(last, False) + head
    if spec.tie_embeddings:  # the last stage holds its own copy of a tied vocabulary projection
        back.append(("logits.tied_copy", round(spec.vocab_size * spec.d_model / plan.tp), dtype))
    candidates = [front, back] + ([blocks(middle, False)] if plan.pp > 2 else [])
    return max(candidates, key=lambda stage: sum(n for _, n, _ in stage))
