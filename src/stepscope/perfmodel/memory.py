"""Memory per GPU: weights, gradients and optimizer state by ZeRO stage, activations by recompute mode and
micro-batches in flight, and the verdict against the device capacity (scalar reference).

Bytes per parameter (N = dp x cp ranks holding the same weights; Rajbhandari et al. 2020 and Megatron-LM):
- fp32 training: 4 (weights) + 4 (grads) + 8 (Adam m, v) = 16;
- mixed precision: 2 + 2 + 12 (fp32 master, m, v) = 16; ZeRO-1 4 + 12/N; ZeRO-2 2 + 14/N; ZeRO-3 16/N;
  with fp32 gradients (Megatron's main_grad) 18, and the distributed optimizer (= ZeRO-1 here) 6 + 12/N.
Activations per layer and micro-batch are the sum of what the ops keep (`ops.py`), which reproduces
Korthikanti et al. 2022; full recomputation keeps only the layer input (plus one layer's activations
while it is recomputed). Stage i of 1F1B holds min(p − i, m) micro-batches, x (1 + (p−1)/(p·v)) when
interleaved: the first p, the fullest middle stage p − 1 (which is the peak when the first holds fewer
layers), the last one, plus the logits and fp32 loss tensors. ZeRO/FSDP shards over `plan.shard` ranks
(HSDP replicas hold copies); FSDP without resharding after forward keeps the stage's gathered weights.
fp8 training keeps bf16 weights and gradients and the fp32 optimizer state (mixed precision) and saves the
linear layers' inputs in fp8 (`ops.Geometry.gemm_input_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.perfmodel.ops import Geometry, Op, activation_precision, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.stages import pipeline_stages
from stepscope.spec import ModelSpec, bytes_per_element
from stepscope.spec.plan import ParallelPlan

GiB = 2.0**30


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter held by one GPU."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def grad_bytes(precision: str, fp32_grads: bool) -> int:
    return 4 if fp32_grads else bytes_per_element(precision)


def state_bytes(precision: str, zero: int, dp: int, fp32_grads: bool = False) -> StateBytes:
    """Per-parameter bytes of weights, gradients and Adam state on one GPU for a ZeRO stage."""
    weights = float(bytes_per_element(precision))
    grads = float(grad_bytes(precision, fp32_grads))
    optimizer = 8.0 + (4.0 if precision != "fp32" else 0.0)  # m, v (+ fp32 master weights)
    return StateBytes(weights / dp if zero >= 3 else weights, grads / dp if zero >= 2 else grads,
                      optimizer / dp if zero >= 1 else optimizer)


def in_flight_micro_batches(pp: int, micro_batches: int, interleave: int) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    held = min(pp, micro_batches)
    if interleave > 1:
        held *= 1 + (pp - 1) / (pp * interleave)
    return float(held)


def layer_activation_bytes(ops: list[Op], recompute: str, g: Geometry, d_model: int) -> float:
    """Activation bytes one layer keeps for one micro-batch under a recompute mode."""
    if recompute == "full":
        return g.sharded_tokens * d_model * g.act_bytes
    if recompute == "selective":
        return sum(op.kept_selective for op in ops)
    return sum(op.saved_bytes for op in ops)


@dataclass(frozen=True)
class Memory:
    """Peak bytes per GPU on the fullest pipeline stage."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    capacity: float
    """Bytes the model may use on the device (capacity minus the reserve)."""

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def feasible(self) -> bool:
        return self.total <= self.capacity

    def GiB(self) -> dict[str, float]:
        return {"weights_GiB": self.weights / GiB, "grads_GiB": self.grads / GiB,
                "optimizer_GiB": self.optimizer / GiB, "activations_GiB": self.activations / GiB,
                "mem_GiB": self.total / GiB, "capacity_GiB": self.capacity / GiB}


def stage_params(spec: ModelSpec, g: Geometry, pp: int) -> tuple[float, float, float]:
    """(layer params per GPU, first-stage extra, last-stage extra): the embedding sits on the first stage,
    the final norm and vocabulary projection on the last (a tied projection is a copy there when pp > 1)."""
    layer = sum(op.params for op in layer_ops(spec, g))
    embedding = sum(op.params for op in embedding_ops(spec, g))
    head = sum(op.params for op in head_ops(spec, g))
    if spec.tie_embeddings and pp > 1:
        head += spec.vocab_size * spec.d_model / g.tp
    return layer, embedding, head


def memory(spec: ModelSpec, g: Geometry, plan: ParallelPlan, precision: str, micro_batches: int,
           capacity_bytes: float) -> Memory:
    """Peak memory per GPU of `plan` on its fullest pipeline stage (first, middle or last)."""
    act_precision = activation_precision(precision)
    layer_params, emb_params, head_params = stage_params(spec, g, plan.pp)
    keeps_weights = plan.zero == 3 and not plan.reshard_after_forward  # gathered weights kept until backward
    per_param = state_bytes(act_precision, 2 if keeps_weights else plan.zero, plan.shard, plan.fp32_grads)
    if keeps_weights:  # the optimizer state stays sharded as in ZeRO-3
        per_param = StateBytes(per_param.weights, per_param.grads,
                               state_bytes(act_precision, 3, plan.shard, plan.fp32_grads).optimizer)
    ops = layer_ops(spec, g)
    per_layer = layer_activation_bytes(ops, plan.recompute, g, spec.d_model)
    working = sum(op.saved_bytes for op in ops) if plan.recompute == "full" else 0.0
    if plan.zero >= 3 and not keeps_weights:  # a gathered copy of the layer being computed and the prefetched one
        working += 2 * layer_params * bytes_per_element(act_precision)
    vocab = spec.vocab_size / g.tp
    e = g.act_bytes
    head_act = g.tokens * vocab * (e + 4 + (4 if e < 4 else 0))  # logits, fp32 log-probs, fp32 copy
    interleaved = 1 + (plan.pp - 1) / (plan.pp * plan.interleave) if plan.interleave > 1 else 1.0
    candidates = []
    for stage in pipeline_stages(plan, spec.n_layers, micro_batches):
        params = layer_params * stage.layers + emb_params * stage.embedding + head_params * stage.head
        held = stage.in_flight * (interleaved if stage.name != "last" else 1.0)
        activations = per_layer * stage.layers * held + working + (head_act if stage.head else 0.0)
        candidates.append((params * per_param.total + activations, params, activations))
    _, params, activations = max(candidates, key=lambda c: c[0])
    return Memory(weights=params * per_param.weights, grads=params * per_param.grads,
                  optimizer=params * per_param.optimizer, activations=activations, capacity=capacity_bytes)
