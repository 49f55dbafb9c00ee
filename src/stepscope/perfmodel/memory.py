"""Memory per GPU: weights, gradients and optimizer state by ZeRO stage, activations by recompute mode and
micro-batches in flight, and the verdict against the device capacity (scalar reference).

Bytes per parameter (N = dp x cp ranks holding the same weights; Rajbhandari et al. 2020 and Megatron-LM):
- fp32 training: 4 (weights) + 4 (grads) + 8 (Adam m, v) = 16;
- mixed precision: 2 + 2 + 12 (fp32 master, m, v) = 16; ZeRO-1 4 + 12/N; ZeRO-2 2 + 14/N; ZeRO-3 16/N;
  with fp32 gradients (Megatron's main_grad) 18, and the distributed optimizer (= ZeRO-1 here) 6 + 12/N.
Activations per layer and micro-batch are the sum of what the ops keep (`ops.py`), which reproduces
Korthikanti et al. 2022; full recomputation keeps only the layer input (plus one layer's activations
while it is recomputed). A pipeline rank holds the micro-batches its schedule's warm-up leaves in flight
(`stages.held_micro_batches`): under 1F1B min(p − rank, m), the first p, the fullest middle stage p − 1 (the
peak when the first holds fewer layers), the last one; interleaved with v chunks (Megatron-Core) rank r holds
(2(p − r − 1) + (v − 1)·p + 1)/v, at most m: the first p + (p−1)/v (Korthikanti et al.'s p·(1 + (p−1)/(p·v))),
the second p + (p−3)/v, the last p − (p−1)/v. The last stage also holds the logits and fp32 loss tensors.
ZeRO/FSDP shards over `plan.shard` ranks (HSDP replicas hold copies); FSDP without resharding after forward
keeps the stage's gathered weights. Under a pipeline schedule (pp > 1, with a backward pass) ZeRO-2/3 keep the
stage's unsharded gradients and gathered weights through a round (`timing.gradient_reductions`): ZeRO-1's memory.
Mixture-of-Experts: the routed experts' weights are 1/ep per GPU with their state sharded over the `expert_dp`
ranks holding the same experts; a MoE block keeps what its ops save (`ops_moe.py`, the expert activations
scaled by the load imbalance of the busiest rank).
fp8 training keeps bf16 weights and gradients and the fp32 optimizer state (mixed precision) and saves the
linear layers' inputs in fp8 (`ops.Geometry.gemm_input_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.perfmodel.ops import Geometry, Op, activation_precision, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.ops_moe import moe_layer_ops
from stepscope.perfmodel.stages import Stage, pipeline_stages
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


def layer_kinds(spec: ModelSpec, g: Geometry) -> tuple[list[Op], list[Op]]:
    """The ops of one dense block and of one Mixture-of-Experts block (empty for a dense model)."""
    return layer_ops(spec, g), (moe_layer_ops(spec, g) if spec.is_moe else [])


@dataclass(frozen=True)
class StageParams:
    """Parameters per GPU: of one dense block, of one MoE block (without the routed experts when they have a
    data-parallel group of their own, `experts_apart`), of one MoE block's routed experts in that case, and the
    embedding and head extras."""

    dense: float
    moe: float
    expert: float
    embedding: float
    head: float

    def of(self, stage: Stage) -> tuple[float, float]:
        """(parameters reduced over dp x cp, expert parameters reduced over the `expert_dp` ranks) of a stage."""
        shared = (self.dense * stage.dense + self.moe * stage.moe + self.embedding * stage.embedding
                  + self.head * stage.head)
        return shared, self.expert * stage.moe


def stage_params(spec: ModelSpec, g: Geometry, pp: int) -> StageParams:
    """Per-GPU parameters of each kind of block and the stage extras: the embedding sits on the first stage, the
    final norm and vocabulary projection on the last (a tied projection is a copy there when pp > 1)."""
    dense_ops, moe_ops = layer_kinds(spec, g)
    layer = sum(op.params for op in dense_ops)
    split = g.experts_apart  # otherwise the experts are reduced and sharded like every other weight
    moe = sum(op.params for op in moe_ops if not (split and op.expert))
    expert = sum(op.params for op in moe_ops if split and op.expert)
    embedding = sum(op.params for op in embedding_ops(spec, g))
    head = sum(op.params for op in head_ops(spec, g))
    if spec.tie_embeddings and pp > 1:
        head += spec.vocab_size * spec.d_model / g.tp
    return StageParams(layer, moe, expert, embedding, head)


def memory(spec: ModelSpec, g: Geometry, plan: ParallelPlan, precision: str, micro_batches: int,
           capacity_bytes: float, forward_only: bool = False) -> Memory:
    """Peak memory per GPU of `plan` on its fullest pipeline stage (first, middle or last). `forward_only`: a
    forward pass keeps no activations, only the largest live one of a layer (approximated by the largest saved
    one) and, under ZeRO-3, the gathered layers."""
    act_precision = activation_precision(precision)
    sp = stage_params(spec, g, plan.pp)
    keeps_weights = plan.zero == 3 and not plan.reshard_after_forward  # gathered weights kept until backward
    # under a pipeline schedule FSDP accumulates unsharded gradients and keeps the gathered weights through a
    # round (`reductions`): at the peak only the optimizer state is sharded, as with ZeRO-1
    zero = 1 if plan.pp > 1 and plan.zero >= 2 and not forward_only else plan.zero
    keeps_weights = keeps_weights and zero == 3

    def per_param_bytes(ranks: int) -> StateBytes:
        per_param = state_bytes(act_precision, 2 if keeps_weights else zero, ranks, plan.fp32_grads)
        if keeps_weights:  # the optimizer state stays sharded as in ZeRO-3
            per_param = StateBytes(per_param.weights, per_param.grads,
                                   state_bytes(act_precision, 3, ranks, plan.fp32_grads).optimizer)
        return per_param

    # expert weights (`experts_apart`): state sharded over the expert-data-parallel ranks
    per_param, per_expert = per_param_bytes(plan.shard), per_param_bytes(plan.expert_dp)
    dense_ops, moe_ops = layer_kinds(spec, g)
    per_dense = layer_activation_bytes(dense_ops, plan.recompute, g, spec.d_model)
    per_moe = layer_activation_bytes(moe_ops, plan.recompute, g, spec.d_model) if moe_ops else 0.0
    working = 0.0
    if plan.recompute == "full":  # one layer's activations while it is recomputed: the larger kind
        working = max(sum(op.saved_bytes for op in ops) for ops in (dense_ops, moe_ops) if ops)
    gathered = 0.0
    if zero >= 3 and not keeps_weights:  # a gathered copy of the layer being computed and the prefetched one
        gathered = 2 * max(sp.dense, sp.moe + sp.expert) * bytes_per_element(act_precision)
    working += gathered
    vocab = spec.vocab_size / g.tp
    e = g.act_bytes
    head_act = g.tokens * vocab * (e + 4 + (4 if e < 4 else 0))  # logits, fp32 log-probs, fp32 copy
    candidates = []
    dense_layers = spec.dense_layers if spec.is_moe else None
    for stage in pipeline_stages(plan, spec.n_layers, micro_batches, dense_layers):
        params, experts = sp.of(stage)
        activations = ((per_dense * stage.dense + per_moe * stage.moe) * stage.in_flight + working
                       + (head_act if stage.head else 0.0))
        candidates.append((params * per_param.total + experts * per_expert.total + activations, params, experts,
                           activations))
    _, params, experts, activations = max(candidates, key=lambda c: c[0])
    if forward_only:
        activations = max(op.saved_bytes for op in dense_ops + moe_ops) + gathered
    return Memory(weights=params * per_param.weights + experts * per_expert.weights,
                  grads=params * per_param.grads + experts * per_expert.grads,
                  optimizer=params * per_param.optimizer + experts * per_expert.optimizer, activations=activations,
                  capacity=capacity_bytes)
