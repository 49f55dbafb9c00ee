"""Predict one training step of one plan: the readable, op-by-op reference evaluation.

`evaluate(spec, workload, plan, system)` walks the ops of one layer, the embedding and the head, times
each (timing.py), adds the collectives each op issues (collectives.py), assembles the pipeline
(stages, bubble, point-to-point), the data-parallel reduction and the optimizer step, and the memory
(memory.py). `vectorized.py` computes the same over many plans at once and is tested against this file.

The workload's `batch` is the GLOBAL batch here (all data-parallel replicas together); `mode` fwd predicts a
forward pass, fwd-bwd forward + backward, train adds the optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.perfmodel.collectives import collective_time, members_per_domain, p2p
from stepscope.perfmodel.memory import GiB, Memory, grad_bytes, layer_kinds, memory, stage_params
from stepscope.perfmodel.ops import Geometry, Op, activation_precision, embedding_ops, head_ops
from stepscope.perfmodel.stages import Stage, pipeline_stages
from stepscope.perfmodel.tensors import param_tensors
from stepscope.perfmodel.timing import (
    DEFAULT_BUCKET_MIB,
    bubble,
    bucket_layout,
    dispatcher_sm_share,
    dp_exposed,
    exposed,
    gradient_reductions,
    op_time,
    optimizer_time,
    overlapped_exchange,
    zero3_gathers,
)
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.plan import DIMENSIONS, ParallelPlan
from stepscope.spec.system import SystemSpec


@dataclass(frozen=True)
class Span:
    """Seconds of one stretch of work: op time, exposed tensor-parallel, context-parallel and expert-parallel
    (all-to-all) collectives."""

    compute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0
    ep_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s

    def __add__(self, other: Span) -> Span:
        return Span(self.compute_s + other.compute_s, self.tp_s + other.tp_s, self.cp_s + other.cp_s,
                    self.ep_s + other.ep_s)

    def __mul__(self, factor: float) -> Span:
        return Span(self.compute_s * factor, self.tp_s * factor, self.cp_s * factor, self.ep_s * factor)

COMM_CAUSES = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")  # the breakdown's exposed communication


@dataclass(frozen=True)
class Prediction:
    """A predicted training step: time by phase and by cause, FLOPs, memory."""

    model: ModelSpec
    workload: Workload
    plan: ParallelPlan
    system: str
    micro_batches: int
    phases: dict[str, float]
    """Seconds per step: forward, backward (with exposed gradient reduction), optimizer, bubble."""
    breakdown: dict[str, float]
    """Seconds per step by cause; sums to step_s."""
    model_flops: float
    """MFU FLOPs of the step over all GPUs."""
    hardware_flops: float
    """model_flops plus recomputation."""
    peak_flops: float
    """Matrix peak of one GPU in the workload's precision."""
    memory: Memory
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return sum(self.phases.values())

    @property
    def tokens_per_s(self) -> float:
        return self.workload.batch * self.workload.seq / self.step_s

    @property
    def mfu_pct(self) -> float:
        return 100.0 * self.model_flops / (self.step_s * self.plan.gpus * self.peak_flops)

    @property
    def hfu_pct(self) -> float:
        return 100.0 * self.hardware_flops / (self.step_s * self.plan.gpus * self.peak_flops)

    def metrics(self) -> dict[str, Any]:
        """Record metrics, units in the names."""
        out: dict[str, Any] = {"step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "mfu_pct": self.mfu_pct,
                               "hfu_pct": self.hfu_pct, "micro_batches": self.micro_batches,
                               "tflops_per_gpu": self.model_flops / self.step_s / self.plan.gpus / 1e12,
                               "feasible": self.memory.feasible}
        out.update({f"{phase}_ms": 1e3 * s for phase, s in self.phases.items()})
        out.update({f"{cause}_s": s for cause, s in self.breakdown.items()})
        out.update(self.memory.GiB())
        return out


def geometry(plan: ParallelPlan, workload: Workload) -> Geometry:
    """One micro-batch on one GPU of `plan`."""
    fp8 = plan.fp8_recipe if workload.precision == "fp8" else None
    return Geometry(plan.micro_batch, workload.seq, bytes_per_element(activation_precision(workload.precision)),
                    plan.tp, plan.cp, plan.sequence_parallel, plan.flash_attention, plan.dropout, fp8, plan.ep,
                    plan.expert_imbalance, plan.dispatcher, plan.expert_tp)


def group_layout(plan: ParallelPlan, domain_size: int) -> dict[str, int]:
    """Members of each dimension's group inside one fast domain, from the plan's placement, of the
    gradient-reduction group `dp_cp` (dp x cp ranks: the product of the two, exact for power-of-two sizes), and
    of the ZeRO/FSDP shard group (`shard`, the innermost `plan.shard` of them) and its replica group
    (`replica`, one rank of every shard group); of the expert-parallel group (`ep`, the innermost `plan.ep` of
    the dp x cp ranks) and the expert-data-parallel group (`edp`, one rank of every EP group)."""
    layout = {dim: members_per_domain(plan.size(dim), plan.stride(dim), domain_size) for dim in DIMENSIONS}
    layout["dp_cp"] = layout["dp"] * layout["cp"]
    layout["shard"] = min(plan.shard, layout["dp_cp"])
    layout["replica"] = max(1, layout["dp_cp"] // plan.shard)
    folded = layout["dp_cp"] * (layout["tp"] if plan.expert_tp == 1 else 1)  # the ranks EP is carved out of
    layout["ep"] = min(plan.ep, folded)
    layout["edp"] = max(1, folded // plan.ep)
    return layout


def direction_span(ops: Sequence[Op], direction: str, system: SystemSpec, precision: str,
                   layout: dict[str, int], overlap: bool, ep_overlap: bool = False, sm_share: float = 0.0) -> Span:
    """Time of `ops` in one direction (forward or backward), with their TP/CP/EP collectives. `precision` is the
    activations'; an op flagged fp8 runs its GEMM at the fp8 rate. With `ep_overlap` the all-to-alls hide
    behind the MoE blocks' GEMMs (`ParallelPlan.ep_overlap`), slowing them by the `sm_share` of the SMs the
    dispatcher holds (`timing.overlapped_exchange`)."""
    compute = tp = cp = ep = window = 0.0
    for op in ops:
        cost = getattr(op, direction)
        timed = op_time(cost, op.kind, system.accelerator, "fp8" if op.fp8 else precision)
        compute += timed.total_s
        if op.block == "moe" and op.kind == "matrix":
            window += timed.compute_s
        for comm in cost.comms:
            seconds = comm.seconds(layout[comm.group], system.network)
            hidden = exposed(seconds, timed.compute_s, comm.hides(layout[comm.group], overlap))
            if comm.group == "cp":
                cp += hidden
            elif comm.group == "ep":
                ep += seconds if ep_overlap else hidden
            else:
                tp += hidden
    if ep_overlap:
        ep = overlapped_exchange(ep, window, sm_share)
    return Span(compute, tp, cp, ep)


def evaluate(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec, *,
             bucket_elements: Sequence[float] | None = None, bucket_cap_MiB: float = DEFAULT_BUCKET_MIB) -> Prediction:
    """Predict one step. `bucket_elements` is a gradient-bucket layout (elements per bucket, in launch
    order; e.g. from the DDP bucket planner); without it buckets of `bucket_cap_MiB` are assumed."""
    workload.check_fits(spec.context_length)
    plan.check(spec, workload.batch, workload.seq)
    precision, mode = workload.precision, workload.mode
    act = activation_precision(precision)
    acc, network = system.accelerator, system.network
    g = geometry(plan, workload)
    e = g.act_bytes
    m = plan.micro_batches(workload.batch)
    layout = group_layout(plan, network.domain_size)
    backward = mode != "fwd"
    sm_share = dispatcher_sm_share(plan.dispatcher, acc)

    def span(ops: Sequence[Op], direction: str) -> Span:
        return direction_span(ops, direction, system, act, layout, plan.tp_overlap, plan.ep_overlap, sm_share)

    # a dense block and (Mixture-of-Experts models) a MoE block: forward, backward, recomputation
    layer, moe_layer = layer_kinds(spec, g)
    kinds = []
    for ops in (layer, moe_layer):
        rec_ops = {"full": ops, "selective": [op for op in ops if op.selective], "none": []}[plan.recompute]
        kinds.append((span(ops, "forward"), span(ops, "backward") if backward else Span(),
                      span(rec_ops, "forward") if backward else Span(), rec_ops))
    (layer_fwd, layer_bwd, layer_rec, recomputed), (moe_fwd, moe_bwd, moe_rec, moe_recomputed) = kinds
    emb, head = embedding_ops(spec, g), head_ops(spec, g)
    emb_fwd, head_fwd = span(emb, "forward"), span(head, "forward")
    emb_bwd, head_bwd = (span(emb, "backward"), span(head, "backward")) if backward else (Span(), Span())

    # the slowest stage sets the pace of the pipeline (first: embedding, last: logits and loss; uneven stages
    # give the first and last fewer layers to balance that)
    stages = pipeline_stages(plan, spec.n_layers, m, spec.dense_layers if spec.is_moe else None)
    timed = []
    for stage in stages:
        fwd = layer_fwd * stage.dense + moe_fwd * stage.moe + (emb_fwd if stage.embedding else Span()) + (
            head_fwd if stage.head else Span())
        bwd = (layer_bwd + layer_rec) * stage.dense + (moe_bwd + moe_rec) * stage.moe + (
            emb_bwd if stage.embedding else Span()) + (head_bwd if stage.head else Span())
        timed.append((fwd.total_s + bwd.total_s, fwd, bwd, stage))
    _, stage_fwd, stage_bwd, pace = max(timed, key=lambda entry: entry[0])
    stage_rec = layer_rec * pace.dense + moe_rec * pace.moe

    # pipeline point-to-point: each micro-batch sends its activations forward and its gradient back,
    # once per virtual chunk; the slowest boundary sets the pace (inter-domain unless the pipeline fits)
    p2p_one = 0.0
    if plan.pp > 1:
        p2p_one = p2p(g.sharded_tokens * spec.d_model * e, layout["pp"] >= plan.pp, network)
    p2p_fwd = plan.interleave * p2p_one
    p2p_bwd = plan.interleave * p2p_one if backward else 0.0

    # gradient reduction over the dp x cp ranks holding the same weights (context-parallel ranks see different
    # tokens of the same sequences), ZeRO parameter gathers; the stage with the most parameters sets the pace
    # (expert weights with a group of their own, `experts_apart`: reduced over the ranks holding the same
    # experts, launched first; they may need it where dp x cp = 1, with whole experts on every TP rank)
    sizes = stage_params(spec, g, plan.pp)
    params, experts, critical = max(((*sizes.of(st), st) for st in stages), key=lambda entry: entry[0] + entry[1])
    n_edp = plan.expert_dp
    gb = grad_bytes(act, plan.fp32_grads)
    n_dp, shard, replicas = plan.dp_cp, plan.shard, plan.replicas
    reduce_s = gather_s = 0.0
    # gradients are reduced where there is a backward pass; ZeRO-3 gathers its weights for forward as well
    if (n_dp > 1 or (experts and n_edp > 1)) and (backward or plan.zero == 3):
        buckets = list(bucket_elements) if bucket_elements else bucket_layout(params, bucket_cap_MiB * 2**20 / gb)
        if backward:  # all-reduce, or reduce-scatter within the shard group; the expert buckets first
            kind, n, group = ("all-reduce", n_dp, "dp_cp") if plan.zero == 0 else ("reduce-scatter", shard, "shard")
            times = [collective_time(kind, b * gb, n, layout[group], network) for b in buckets]
            if experts:
                times = [collective_time(kind, b * gb, n_edp, layout["edp"], network)
                         for b in bucket_layout(experts, bucket_cap_MiB * 2**20 / gb)] + times
            reductions = gradient_reductions(plan.pp, plan.pipeline_rounds, plan.zero, m)
            reduce_s = float(reductions * dp_exposed(times, stage_bwd.total_s, plan.dp_overlap))
        if backward and plan.zero >= 1 and replicas > 1:  # HSDP: the reduced shards all-reduced across replicas
            shard_times = [collective_time("all-reduce", b / shard * gb, replicas, layout["replica"], network)
                           for b in buckets]
            reduce_s += (plan.pipeline_rounds if plan.pp > 1 else 1) * dp_exposed(shard_times, stage_bwd.total_s,
                                                                                plan.dp_overlap)
        # ZeRO-3 gathers the weights it computes with (fp8 where the recipe allows); ZeRO-1/2 the updated
        # 16-bit shards
        if plan.zero == 3:
            fp8_params = (sum(op.params for op in layer if op.fp8) * critical.dense
                          + sum(op.params for op in moe_layer if op.fp8 and not (op.expert and plan.experts_apart))
                          * critical.moe)
            gathered = gathered_bytes(fp8_params, params, e, g)
        else:
            gathered = params * e
        weights_s = collective_time("all-gather", gathered, shard, layout["shard"], network)
        if experts:  # the expert weights (fp8 as the others under ZeRO-3) are gathered over their own group
            fp8_experts = plan.zero == 3 and g.fp8 and g.fp8_recipe != "blockwise"
            weights_s += collective_time("all-gather", experts * (1 if fp8_experts else e), n_edp, layout["edp"],
                                         network)
        first_bucket = collective_time("all-gather", min(1.0, buckets[0] / params) * gathered, shard,
                                       layout["shard"], network)
        if plan.zero == 3:  # each gather hides behind the pass it serves, but for its first bucket
            forwards, backwards = zero3_gathers(plan.pp, plan.pipeline_rounds, m, backward, plan.reshard_after_forward)
            per_pass = [max(weights_s - window, first_bucket) if plan.dp_overlap else weights_s
                        for window in (stage_fwd.total_s, stage_bwd.total_s)]
            gather_s = float(forwards * per_pass[0] + backwards * per_pass[1])
        elif plan.zero in (1, 2) and mode == "train":  # updated shards gathered after the optimizer step
            gather_s = max(weights_s - stage_fwd.total_s, first_bucket) if plan.dp_overlap else weights_s

    optimizer_s = 0.0
    if mode == "train":
        local = params / shard + experts / n_edp if plan.zero >= 1 else params + experts
        tensors = param_tensors(spec, critical.dense, critical.embedding, critical.head, critical.moe)
        optimizer_s = optimizer_time(local, tensors, act, gb, acc).total_s

    per_micro_batch = stage_fwd.total_s + stage_bwd.total_s + p2p_fwd + p2p_bwd
    bubble_s = bubble(plan.pp, plan.interleave, per_micro_batch, plan.pipeline_rounds)
    z3_gathers = gather_s if plan.zero == 3 else 0.0  # in the backward phase, or forward's without one
    phases = {"forward": m * (stage_fwd.total_s + p2p_fwd) + (0.0 if backward else z3_gathers),
              "backward": m * (stage_bwd.total_s + p2p_bwd) + reduce_s + (z3_gathers if backward else 0.0),
              "optimizer": optimizer_s + (gather_s if plan.zero in (1, 2) else 0.0),
              "bubble": bubble_s}
    breakdown = {"forward_compute": m * stage_fwd.compute_s,
                 "backward_compute": m * (stage_bwd.compute_s - stage_rec.compute_s),
                 "recompute": m * stage_rec.compute_s,
                 "tp_comm": m * (stage_fwd.tp_s + stage_bwd.tp_s),
                 "cp_comm": m * (stage_fwd.cp_s + stage_bwd.cp_s),
                 "ep_comm": m * (stage_fwd.ep_s + stage_bwd.ep_s),
                 "pp_comm": m * (p2p_fwd + p2p_bwd),
                 "bubble": bubble_s,
                 "dp_comm": reduce_s + gather_s,
                 "optimizer": optimizer_s}

    tokens = workload.batch * workload.seq
    model_flops = tokens * (spec.flops_per_token(workload.seq) if backward
                            else spec.forward_flops_per_token(workload.seq))
    n_dense = spec.n_layers - spec.moe_layers
    recompute_flops = ((sum(op.forward.model_flops for op in recomputed) * n_dense
                        + sum(op.forward.model_flops for op in moe_recomputed) * spec.moe_layers) / plan.pp * m
                       * plan.gpus if backward else 0.0)
    mem = memory(spec, g, plan, precision, m, acc.capacity_bytes, forward_only=not backward)
    if mode != "train":  # no optimizer exists; a forward-only pass keeps no gradients
        mem = Memory(mem.weights, mem.grads if backward else 0.0, 0.0, mem.activations, mem.capacity)
    # MFU and HFU are against the 16-bit dense peak, fp8 runs included (the convention of published fp8 MFU)
    return Prediction(model=spec, workload=workload, plan=plan, system=system.name, micro_batches=m, phases=phases,
                      breakdown=breakdown, model_flops=model_flops, hardware_flops=model_flops + recompute_flops,
                      peak_flops=acc.matrix_peak(act), memory=mem,
                      extras={"layout": layout, "params_per_gpu": params + experts, "pace_stage": pace.name})


def gathered_bytes(fp8_params: float, params: float, act_bytes: int, g: Geometry) -> float:
    """Bytes a ZeRO-3/FSDP all-gather of a stage's weights moves: fp8 GEMM weights in one byte where the
    recipe casts before gathering (delayed or current per-tensor scaling, as torchao's fp8 all-gather), the
    rest in the activations' precision."""
    if not g.fp8 or g.fp8_recipe == "blockwise":
        return params * act_bytes
    return fp8_params + (params - fp8_params) * act_bytes


def gradient_tensors(spec: ModelSpec, workload: Workload, plan: ParallelPlan) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of the gradients one GPU's data-parallel reduction carries, in parameter
    registration order, for the pipeline stage holding the most parameters: the input the DDP bucket
    planner (`stepscope.spec.buckets.plan_buckets`) takes. One entry per op (its weight and bias)."""
    g = geometry(plan, workload)
    dtype = "fp32" if plan.fp32_grads or workload.precision == "fp32" else activation_precision(workload.precision)
    dense_ops, moe_ops = layer_kinds(spec, g)
    if plan.experts_apart:  # expert gradients go to their own (expert-data-parallel) reduction
        moe_ops = [op for op in moe_ops if not op.expert]

    def entries(ops: Sequence[Op], prefix: str) -> list[tuple[str, int, str]]:
        return [(f"{prefix}{op.name}", round(op.params), dtype) for op in ops if op.params > 0]

    def blocks(stage: Stage) -> list[tuple[str, int, str]]:
        return [e for i in range(stage.layers)
                for e in entries(dense_ops if i < stage.dense else moe_ops, f"blocks.{i}.")]

    stages = pipeline_stages(plan, spec.n_layers, 1, spec.dense_layers if spec.is_moe else None)
    first = entries(embedding_ops(spec, g), "") + blocks(stages[0])
    if plan.pp == 1:
        return first + entries(head_ops(spec, g), "")
    last = blocks(stages[-1]) + entries(head_ops(spec, g), "")
    if spec.tie_embeddings:  # the last stage holds its own copy of a tied vocabulary projection
        last.append(("logits.tied_copy", round(spec.vocab_size * spec.d_model / plan.tp), dtype))
    candidates = [first, last] + ([blocks(stages[1])] if plan.pp > 2 else [])
    return max(candidates, key=lambda stage: sum(n for _, n, _ in stage))


__all__ = ["Prediction", "Span", "evaluate", "gradient_tensors", "group_layout", "GiB"]
