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
from stepscope.perfmodel.memory import GiB, Memory, grad_bytes, memory, stage_params
from stepscope.perfmodel.ops import Geometry, Op, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.timing import (
    DEFAULT_BUCKET_MIB,
    bubble,
    bucket_layout,
    dp_exposed,
    exposed,
    op_time,
    optimizer_time,
)
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.plan import DIMENSIONS, ParallelPlan
from stepscope.spec.system import SystemSpec


@dataclass(frozen=True)
class Span:
    """Seconds of one stretch of work: op time, exposed tensor-parallel and context-parallel collectives."""

    compute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s

    def __add__(self, other: Span) -> Span:
        return Span(self.compute_s + other.compute_s, self.tp_s + other.tp_s, self.cp_s + other.cp_s)

    def __mul__(self, factor: float) -> Span:
        return Span(self.compute_s * factor, self.tp_s * factor, self.cp_s * factor)


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


def group_layout(plan: ParallelPlan, domain_size: int) -> dict[str, int]:
    """Members of each dimension's group inside one fast domain, from the plan's placement, and of the
    gradient-reduction group `dp_cp` (dp x cp ranks: the product of the two, exact for power-of-two sizes)."""
    layout = {dim: members_per_domain(plan.size(dim), plan.stride(dim), domain_size) for dim in DIMENSIONS}
    layout["dp_cp"] = layout["dp"] * layout["cp"]
    return layout


def direction_span(ops: Sequence[Op], direction: str, system: SystemSpec, precision: str,
                   layout: dict[str, int], overlap: bool) -> Span:
    """Time of `ops` in one direction (forward or backward), with their TP/CP collectives."""
    compute = tp = cp = 0.0
    for op in ops:
        cost = getattr(op, direction)
        timed = op_time(cost, op.kind, system.accelerator, precision)
        compute += timed.total_s
        for comm in cost.comms:
            seconds = collective_time(comm.kind, comm.bytes, comm.size, layout[comm.group], system.network)
            hidden = exposed(seconds, timed.compute_s, overlap and comm.overlappable)
            if comm.group == "cp":
                cp += hidden
            else:
                tp += hidden
    return Span(compute, tp, cp)


def param_tensors(spec: ModelSpec, layers: int, embedding: bool, head: bool) -> int:
    """Number of parameter tensors on a stage (the optimizer launches about one pass per tensor)."""
    norm = 2 if spec.norm == "layer" else 1
    per_layer = 2 * norm + 2 * (2 if spec.attn_bias else 1) + 2 * (2 if spec.mlp_bias else 1)
    count = layers * per_layer
    if embedding:
        count += 1 + (spec.positions == "learned")
    if head:
        count += norm + (0 if spec.tie_embeddings else 1)
    return count


def evaluate(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec, *,
             bucket_elements: Sequence[float] | None = None, bucket_cap_MiB: float = DEFAULT_BUCKET_MIB) -> Prediction:
    """Predict one step. `bucket_elements` is a gradient-bucket layout (elements per bucket, in launch
    order; e.g. from the DDP bucket planner); without it buckets of `bucket_cap_MiB` are assumed."""
    workload.check_fits(spec.context_length)
    plan.check(spec, workload.batch, workload.seq)
    precision, mode = workload.precision, workload.mode
    acc, network = system.accelerator, system.network
    e = bytes_per_element(precision)
    g = Geometry(plan.micro_batch, workload.seq, e, plan.tp, plan.cp, plan.sequence_parallel,
                 plan.flash_attention, plan.dropout)
    m = plan.micro_batches(workload.batch)
    layout = group_layout(plan, network.domain_size)
    backward = mode != "fwd"

    def span(ops: Sequence[Op], direction: str) -> Span:
        return direction_span(ops, direction, system, precision, layout, plan.tp_overlap)

    layer = layer_ops(spec, g)
    layer_fwd = span(layer, "forward")
    layer_bwd = span(layer, "backward") if backward else Span()
    recomputed = {"full": layer, "selective": [op for op in layer if op.selective], "none": []}[plan.recompute]
    layer_rec = span(recomputed, "forward") if backward else Span()
    emb, head = embedding_ops(spec, g), head_ops(spec, g)
    extras_fwd = {"first": span(emb, "forward"), "last": span(head, "forward")}
    extras_bwd = {"first": span(emb, "backward"), "last": span(head, "backward")} if backward else \
        {"first": Span(), "last": Span()}
    layers = spec.n_layers // plan.pp
    stage_rec = layer_rec * layers
    if plan.pp == 1:  # one stage holds the embedding and the head
        stage_fwd = layer_fwd * layers + extras_fwd["first"] + extras_fwd["last"]
        stage_bwd = (layer_bwd + layer_rec) * layers + extras_bwd["first"] + extras_bwd["last"]
    else:  # the slower of the first stage (embedding) and the last (logits, loss) sets the pace
        candidates = []
        for which in ("first", "last"):
            fwd = layer_fwd * layers + extras_fwd[which]
            bwd = (layer_bwd + layer_rec) * layers + extras_bwd[which]
            candidates.append((fwd.total_s + bwd.total_s, fwd, bwd))
        _, stage_fwd, stage_bwd = max(candidates, key=lambda c: c[0])

    # pipeline point-to-point: each micro-batch sends its activations forward and its gradient back,
    # once per virtual chunk; the slowest boundary sets the pace (inter-domain unless the pipeline fits)
    p2p_one = 0.0
    if plan.pp > 1:
        p2p_one = p2p(g.sharded_tokens * spec.d_model * e, layout["pp"] >= plan.pp, network)
    p2p_fwd = plan.interleave * p2p_one
    p2p_bwd = plan.interleave * p2p_one if backward else 0.0

    # gradient reduction over the dp x cp ranks holding the same weights (context-parallel ranks see different
    # tokens of the same sequences), ZeRO parameter gathers; the stage with the most parameters sets the pace
    layer_params, first_extra, last_extra = stage_params(spec, g, plan.pp)
    stage_param_counts = ([layer_params * layers + first_extra + last_extra] if plan.pp == 1 else
                          [layer_params * layers + first_extra, layer_params * layers + last_extra])
    params = max(stage_param_counts)
    critical = stage_param_counts.index(params)
    holds_embedding, holds_head = (True, True) if plan.pp == 1 else (critical == 0, critical == 1)
    gb = grad_bytes(precision, plan.fp32_grads)
    n_dp, dp_g = plan.dp_cp, layout["dp_cp"]
    reduce_s = gather_s = 0.0
    if backward and n_dp > 1:
        buckets = list(bucket_elements) if bucket_elements else bucket_layout(params, bucket_cap_MiB * 2**20 / gb)
        kind = "all-reduce" if plan.zero == 0 else "reduce-scatter"
        times = [collective_time(kind, b * gb, n_dp, dp_g, network) for b in buckets]
        # sharded gradients (ZeRO-2/3) have no full-size buffer to accumulate micro-batches into: they are
        # reduced after every micro-batch's backward, not once per step
        reductions = m if plan.zero >= 2 else 1
        reduce_s = reductions * dp_exposed(times, stage_bwd.total_s, plan.dp_overlap)
        if plan.zero == 3:  # weights gathered before every forward and backward of every micro-batch
            weights_s = collective_time("all-gather", params * e, n_dp, dp_g, network)
            first_bucket = collective_time("all-gather", min(params, buckets[0]) * e, n_dp, dp_g, network)
            per_pass = [max(weights_s - stage_fwd.total_s, first_bucket), max(weights_s - stage_bwd.total_s,
                                                                              first_bucket)]
            gather_s = m * (sum(per_pass) if plan.dp_overlap else 2 * weights_s)
        elif plan.zero in (1, 2) and mode == "train":  # updated shards gathered after the optimizer step
            weights_s = collective_time("all-gather", params * e, n_dp, dp_g, network)
            first_bucket = collective_time("all-gather", min(params, buckets[0]) * e, n_dp, dp_g, network)
            gather_s = max(weights_s - stage_fwd.total_s, first_bucket) if plan.dp_overlap else weights_s

    optimizer_s = 0.0
    if mode == "train":
        local = params / n_dp if plan.zero >= 1 else params
        tensors = param_tensors(spec, layers, holds_embedding, holds_head)
        optimizer_s = optimizer_time(local, tensors, precision, gb, acc).total_s

    per_micro_batch = stage_fwd.total_s + stage_bwd.total_s + p2p_fwd + p2p_bwd
    bubble_s = bubble(plan.pp, plan.interleave, per_micro_batch)
    phases = {"forward": m * (stage_fwd.total_s + p2p_fwd),
              "backward": m * (stage_bwd.total_s + p2p_bwd) + reduce_s + (gather_s if plan.zero == 3 else 0.0),
              "optimizer": optimizer_s + (gather_s if plan.zero in (1, 2) else 0.0),
              "bubble": bubble_s}
    breakdown = {"forward_compute": m * stage_fwd.compute_s,
                 "backward_compute": m * (stage_bwd.compute_s - stage_rec.compute_s),
                 "recompute": m * stage_rec.compute_s,
                 "tp_comm": m * (stage_fwd.tp_s + stage_bwd.tp_s),
                 "cp_comm": m * (stage_fwd.cp_s + stage_bwd.cp_s),
                 "pp_comm": m * (p2p_fwd + p2p_bwd),
                 "bubble": bubble_s,
                 "dp_comm": reduce_s + gather_s,
                 "optimizer": optimizer_s}

    tokens = workload.batch * workload.seq
    model_flops = tokens * (spec.flops_per_token(workload.seq) if backward
                            else spec.forward_flops_per_token(workload.seq))
    recompute_flops = sum(op.forward.model_flops for op in recomputed) * layers * m * plan.gpus if backward else 0.0
    mem = memory(spec, g, plan, precision, m, acc.capacity_bytes)
    if mode != "train":  # no optimizer exists; a forward-only pass keeps no activations nor gradients
        mem = Memory(mem.weights, mem.grads if backward else 0.0, 0.0,
                     mem.activations if backward else _forward_working_set(layer), mem.capacity)
    return Prediction(model=spec, workload=workload, plan=plan, system=system.name, micro_batches=m, phases=phases,
                      breakdown=breakdown, model_flops=model_flops, hardware_flops=model_flops + recompute_flops,
                      peak_flops=acc.matrix_peak(precision), memory=mem,
                      extras={"layout": layout, "params_per_gpu": params})


def gradient_tensors(spec: ModelSpec, workload: Workload, plan: ParallelPlan) -> list[tuple[str, int, str]]:
    """(name, elements, dtype) of the gradients one GPU's data-parallel reduction carries, in parameter
    registration order, for the pipeline stage holding the most parameters: the input the DDP bucket
    planner (`stepscope.spec.buckets.plan_buckets`) takes. One entry per op (its weight and bias)."""
    g = Geometry(plan.micro_batch, workload.seq, bytes_per_element(workload.precision), plan.tp, plan.cp,
                 plan.sequence_parallel, plan.flash_attention, plan.dropout)
    dtype = "fp32" if plan.fp32_grads or workload.precision == "fp32" else workload.precision
    layers = spec.n_layers // plan.pp

    def entries(ops: Sequence[Op], prefix: str) -> list[tuple[str, int, str]]:
        return [(f"{prefix}{op.name}", round(op.params), dtype) for op in ops if op.params > 0]

    blocks = [e for i in range(layers) for e in entries(layer_ops(spec, g), f"blocks.{i}.")]
    first = entries(embedding_ops(spec, g), "") + blocks
    last = blocks + entries(head_ops(spec, g), "")
    if plan.pp == 1:
        return entries(embedding_ops(spec, g), "") + last
    if spec.tie_embeddings:  # the last stage holds its own copy of a tied vocabulary projection
        last.append(("logits.tied_copy", round(spec.vocab_size * spec.d_model / plan.tp), dtype))
    return max((first, last), key=lambda stage: sum(n for _, n, _ in stage))


def _forward_working_set(layer: Sequence[Op]) -> float:
    """Inference keeps only the largest live activation of one layer (approximated by the largest saved one)."""
    return max((op.saved_bytes for op in layer), default=0.0)


__all__ = ["Prediction", "Span", "evaluate", "gradient_tensors", "group_layout", "GiB"]
