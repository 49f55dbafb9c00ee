"""What a plan costs apart from its ZeRO stage and recompute mode, over numpy arrays (one element per plan).

The ops of one dense block, one Mixture-of-Experts block, the embedding and the head (`ops.py`, `ops_moe.py`) are
timed op by op (`rates.op_time`) with the collectives each issues (`collectives.py`), into `Span`s per direction;
the pipeline's stages are counted (layers, micro-batches held, parameters), the data-parallel collectives are
priced for every ZeRO stage at once (all-reduce or reduce-scatter, gathers), and the activation bytes for every
recompute mode. `step.assemble` then picks what each plan's ZeRO stage and recompute mode use. A search repeats
each (shape, placement, attention kind) for every ZeRO stage and recompute mode, so these terms are computed once
for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.collectives import p2p
from stepscope.perfmodel.model.data_parallel import DataParallelTerms, data_parallel_terms
from stepscope.perfmodel.model.layout import data_parallel_sizes, geometry, group_layout
from stepscope.perfmodel.model.op_types import Geometry, Op
from stepscope.perfmodel.model.ops import activation_precision, embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.model.ops_moe import moe_layer_ops
from stepscope.perfmodel.model.rates import on_stack, op_time
from stepscope.perfmodel.model.schedule import (
    DEFAULT_BUCKET_MIB,
    dispatcher_sm_share,
    held_micro_batches,
    optimizer_time,
    overlapped_exchange,
)
from stepscope.perfmodel.model.tensor_overlap import overlapped_tp
from stepscope.perfmodel.model.tensors import param_tensors
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import stage_layers
from stepscope.spec.stack import load_stack
from stepscope.spec.system import SystemSpec

PIPELINE_SYNC_S = 15e-6
"""A device synchronisation after a batched pipeline exchange and the launch queue refilling after it (an estimate
of 10-20 µs; Megatron-LM p2p_communication.py calls torch.cuda.synchronize() "to protect against race condition
when using batch_isend_irecv()")."""

STAGES = ("first", "middle", "last")
"""The distinct pipeline stages: rank 0 (with the embedding), rank 1 (the fullest middle one; pp > 2) and the
last (with the head). With pp = 1 the first is the only stage and holds the head too."""


@dataclass(frozen=True)
class Span:
    """Seconds of one stretch of work: op time and the exposed tensor-, context- and expert-parallel collectives."""

    compute_s: Any = 0.0
    tp_s: Any = 0.0
    cp_s: Any = 0.0
    ep_s: Any = 0.0

    @property
    def total_s(self) -> Any:
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s

    def __add__(self, other: Span) -> Span:
        return Span(self.compute_s + other.compute_s, self.tp_s + other.tp_s, self.cp_s + other.cp_s,
                    self.ep_s + other.ep_s)

    def __mul__(self, factor: Any) -> Span:
        return Span(self.compute_s * factor, self.tp_s * factor, self.cp_s * factor, self.ep_s * factor)

    def where(self, mask: Any, other: Span) -> Span:
        """This span where `mask`, else `other`."""
        return Span(*(np.where(mask, a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other),
                                                            strict=True)))


def direction_span(ops: Sequence[Op], direction: str, system: SystemSpec, precision: str, layout: dict[str, Any],
                   overlap: bool, ep_overlap: bool = False, sm_share: float = 0.0,
                   tensor_overlap: str = "userbuffers") -> Span:
    """Time of `ops` in one direction (forward or backward), with their TP/CP/EP collectives. `precision` is the
    activations'; an op flagged fp8 runs its GEMM at the fp8 rate. With `overlap` (`ParallelPlan.tp_overlap`)
    tensor-parallel collectives inside one domain overlap their GEMMs as the stack's `tensor_overlap` decomposes
    them (`tensor_overlap.py`). With `ep_overlap` the all-to-alls hide behind the MoE blocks' GEMMs
    (`ParallelPlan.ep_overlap`), slowing them by the `sm_share` of the SMs the dispatcher holds
    (`schedule.overlapped_exchange`)."""
    compute = tp = cp = ep = window = 0.0
    for op in ops:
        cost = getattr(op, direction)
        op_precision = "fp8" if op.fp8 else precision
        timed = op_time(cost, op.kind, system.accelerator, op_precision)
        compute = compute + timed.total_s
        if op.block == "moe" and op.kind == "matrix":
            window = window + timed.compute_s
        for comm in cost.comms:
            if comm.group == "ep" and ep_overlap:
                ep = ep + comm.total(layout[comm.group], system.network)
                continue
            if comm.group == "tp" and op.kind == "matrix":
                hides = comm.hides(layout["tp"], overlap)
                decomposed = overlapped_tp(comm, cost, timed.compute_s, direction, layout["tp"], system.network,
                                           system.accelerator, op_precision, 2, tensor_overlap)
                hidden = np.where(hides, decomposed, comm.total(layout["tp"], system.network))
            else:
                hidden = comm.exposed(layout[comm.group], system.network, timed.compute_s, overlap)
            if comm.group == "cp":
                cp = cp + hidden
            elif comm.group == "ep":
                ep = ep + hidden
            else:
                tp = tp + hidden
    if ep_overlap:
        ep = overlapped_exchange(ep, window, sm_share)
    return Span(compute, tp, cp, ep)


@dataclass(frozen=True)
class LayerKind:
    """One kind of block (dense or MoE) per micro-batch: forward and backward spans, what each recompute mode
    re-runs (none, selective: the unfused attention core; full: the whole forward), its activation bytes per
    recompute mode, and its parameters (without routed experts that have their own reduction group)."""

    forward: Span
    backward: Span
    recompute: tuple[Span, Span, Span]
    recompute_flops: tuple[Any, Any, Any]
    activations: tuple[Any, Any, Any]
    saved_all: Any
    """Every op's saved bytes: the working set while a fully recomputed layer runs."""
    params: Any
    expert_params: Any
    fp8_params: Any
    """Parameters of its fp8 GEMMs (ZeRO-3 may gather them in fp8), routed experts with their own group aside."""


def activation_bytes(ops: Sequence[Op], g: Geometry, d_model: int) -> tuple[Any, Any, Any]:
    """Activation bytes one block keeps for one micro-batch under each recompute mode: none (what its ops save),
    selective (the s x s tensors are recomputed, not kept) and full (only the block's input)."""
    return (sum(op.saved_bytes for op in ops), sum(op.kept_selective for op in ops),
            g.sharded_tokens * d_model * g.act_bytes)


def _layer_kind(ops: list[Op], g: Geometry, span, backward: bool, d_model: int) -> LayerKind:
    forward = span(ops, "forward")
    selective = [op for op in ops if op.selective]
    none = Span()
    if backward:
        backward_span, recompute = span(ops, "backward"), (none, span(selective, "forward"), forward)
    else:
        backward_span, recompute = none, (none, none, none)
    split = g.experts_apart  # else the routed experts are reduced and sharded like every other weight
    return LayerKind(
        forward, backward_span, recompute,
        (0.0, sum(op.forward.model_flops for op in selective), sum(op.forward.model_flops for op in ops)),
        activation_bytes(ops, g, d_model),
        sum(op.saved_bytes for op in ops),
        sum(np.where(split & op.expert, 0.0, op.params) for op in ops),
        sum(np.where(split & op.expert, op.params, 0.0) for op in ops),
        sum(np.where(split & op.expert, 0.0, op.params) for op in ops if op.fp8))


@dataclass(frozen=True)
class Terms:
    """Everything `step.assemble` needs, as arrays (one element per plan) or plain numbers."""

    m: Any
    """Micro-batches per step."""
    gpus: Any
    pp: Any
    interleave: Any
    rounds: int
    dense: LayerKind
    moe: LayerKind | None
    embedding: tuple[Span, Span]
    head: tuple[Span, Span]
    p2p_s: tuple[Any, Any]
    """Pipeline point-to-point per micro-batch that shows, forward and backward (once per virtual chunk)."""
    p2p_one: Any
    """One pipeline send of a micro-batch's activations (or their gradient)."""
    p2p_fill: Any
    """Pipeline sends that show per round where the steady state hides them: on the schedule's fill and drain."""
    stage_blocks: tuple[tuple[Any, Any], ...]
    """(dense, MoE) blocks of the first, middle and last stage."""
    stage_exists: tuple[Any, Any, Any]
    holds_head: tuple[Any, Any, Any]
    held: tuple[Any, Any, Any]
    """Micro-batches whose activations each stage holds at its peak."""
    stage_params: tuple[tuple[Any, Any], ...]
    """(parameters reduced over dp x cp, routed-expert parameters reduced over their own group) per stage."""
    critical: Any
    """The stage with the most parameters (index into STAGES): it sets the data-parallel and optimizer time."""
    dp_sizes: dict[str, Any]
    dp: DataParallelTerms
    """The critical stage's data-parallel collectives (`data_parallel.py`)."""
    critical_blocks: Any
    """Transformer blocks on the critical stage (FSDP's units)."""
    optimizer_s: tuple[Any, Any]
    """The Adam step over all local parameters, and over the ZeRO shard."""
    gathered_layer_bytes: Any
    """ZeRO-3 holds two gathered layers (the one computing and the prefetched one): bytes of the largest."""
    head_activation_bytes: Any
    forward_only_bytes: Any
    """A forward pass keeps only the largest saved tensor of a layer."""


def micro_batches(c: Candidates, workload: Workload) -> np.ndarray:
    """Micro-batches per step of each plan: the global batch over dp replicas of micro_batch sequences."""
    return workload.batch // (c.dp * c.micro_batch)


def group_terms(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates, flash_attention: bool, *,
                bucket_elements: Sequence[float] | None = None,
                bucket_cap_MiB: float = DEFAULT_BUCKET_MIB) -> Terms:
    """`Terms` of every plan of `c` (all of one attention kind). `bucket_elements` is a gradient-bucket layout
    (elements per bucket, in launch order, shared by every plan); without it buckets of `bucket_cap_MiB`."""
    act = activation_precision(workload.precision)
    stack = load_stack(c.stack)
    system = on_stack(system, stack)
    acc, network = system.accelerator, system.network
    backward = workload.mode != "fwd"
    g = geometry(c, workload, flash_attention)
    e = g.act_bytes
    layout = group_layout(c, network.domain_size)
    sm_share = dispatcher_sm_share(c.dispatcher, acc)

    def span(ops: Sequence[Op], direction: str) -> Span:
        return direction_span(ops, direction, system, act, layout, c.tp_overlap, c.ep_overlap, sm_share,
                              stack.tensor_overlap)

    dense_ops = layer_ops(spec, g)
    moe_ops = moe_layer_ops(spec, g) if spec.is_moe else []
    dense = _layer_kind(dense_ops, g, span, backward, spec.d_model)
    moe = _layer_kind(moe_ops, g, span, backward, spec.d_model) if moe_ops else None
    emb, head = embedding_ops(spec, g), head_ops(spec, g)
    none = Span()
    embedding = (span(emb, "forward"), span(emb, "backward") if backward else none)
    head_spans = (span(head, "forward"), span(head, "backward") if backward else none)

    # pipeline point-to-point: each micro-batch sends its activations forward and its gradient back, once per
    # virtual chunk, inter-domain unless the whole pipeline group sits in one domain. Plain 1F1B exchanges them
    # batched and synchronises the device after each (Megatron-LM: `batch_p2p_sync`, the non-interleaved schedule
    # cannot overlap them); the interleaved schedule of a stack that overlaps (`overlap_p2p_comm`) hides them behind
    # the next chunk's compute but for the schedule's fill and drain, one send per stage boundary each
    p2p_one = np.where(c.pp > 1, p2p(g.sharded_tokens * spec.d_model * e, layout["pp"] >= c.pp, network), 0.0)
    hidden = (c.interleave > 1) & (stack.pipeline_p2p == "overlapped")
    exposed_one = np.where(hidden, 0.0, c.interleave * (p2p_one + np.where(c.pp > 1, PIPELINE_SYNC_S, 0.0)))
    p2p_s = (exposed_one, exposed_one if backward else 0.0)
    p2p_fill = np.where(hidden, (1 + backward) * (c.pp - 1) * p2p_one, 0.0)

    # stages: layers (a MoE model's leading dense blocks sit on the first stage; those that do not fit there are
    # counted as MoE blocks of the middle stages, which hold more parameters: a bound), micro-batches held
    m = micro_batches(c, workload)
    first, middle, last = stage_layers(c.pp, c.first_stage_layers, c.last_stage_layers, spec.n_layers)
    if spec.is_moe:
        first_dense = np.minimum(spec.n_layers - spec.moe_layers, first)
        blocks = ((first_dense, first - first_dense), (0, middle), (0, last))
    else:
        blocks = ((first, 0), (middle, 0), (last, 0))
    single = c.pp == 1
    exists = (True, c.pp > 2, ~single)
    holds_head = (single, False, ~single)
    per_round = np.where(single, m, m // c.pipeline_rounds)  # a pipeline round holds at most its own
    held = tuple(held_micro_batches(c.pp, rank, c.interleave, per_round) for rank in (0, 1, c.pp - 1))

    # parameters per stage: the embedding on the first, the final norm and vocabulary projection on the last (a
    # tied projection is a copy there when pp > 1)
    emb_params, head_params = sum(op.params for op in emb), sum(op.params for op in head)
    if spec.tie_embeddings:
        head_params = head_params + np.where(single, 0.0, spec.vocab_size * spec.d_model / c.tp)
    moe_kind = moe or dense  # a dense model has no MoE blocks: their count is 0
    stage_params = tuple((dense.params * d + moe_kind.params * mo + emb_params * (i == 0) + head_params * holds_head[i],
                          moe_kind.expert_params * mo)
                         for i, (d, mo) in enumerate(blocks))
    sizes = [np.where(exists[i], shared + experts, -np.inf) for i, (shared, experts) in enumerate(stage_params)]
    critical = np.argmax(np.stack(np.broadcast_arrays(*sizes)), axis=0)
    params, experts = (_pick(critical, [p[k] for p in stage_params]) for k in (0, 1))
    critical_dense, critical_moe = (_pick(critical, [b[k] for b in blocks]) for k in (0, 1))

    # data-parallel collectives of the critical stage, for every ZeRO stage, as its stack schedules them
    dp = data_parallel_sizes(c)
    grad_bytes = 4 if c.fp32_grads else e
    fp8_gather = g.fp8 and c.fp8_recipe != "blockwise"  # ZeRO-3 gathers fp8 weights where the recipe allows
    fp8_params = dense.fp8_params * critical_dense + moe_kind.fp8_params * critical_moe
    root = emb_params * (critical == 0) + head_params * _pick(critical, list(holds_head))
    dp_terms = data_parallel_terms(
        stack.data_parallel, layout, network, dp, params=params, experts=experts,
        blocks=critical_dense + critical_moe, root=root,
        zero3_bytes=(fp8_params + (params - fp8_params) * e) if fp8_gather else params * e,
        zero3_expert_bytes=experts * (1 if fp8_gather else e), act_bytes=e, grad_bytes=grad_bytes,
        chunks=np.where(single, 1, c.interleave), bucket_cap_MiB=bucket_cap_MiB, bucket_elements=bucket_elements)

    # the optimizer over all local parameters, or over the ZeRO shard
    optimizer_s = (0.0, 0.0)
    if workload.mode == "train":
        tensors = param_tensors(spec, critical_dense, critical == 0, _pick(critical, list(holds_head)), critical_moe)
        optimizer_s = tuple(optimizer_time(local, tensors, act, grad_bytes, acc)
                            for local in (params + experts, params / dp["shard"] + experts / dp["edp"]))

    largest_layer = np.maximum(dense.params, moe.params + moe.expert_params) if moe else dense.params
    vocab = spec.vocab_size / c.tp
    return Terms(
        m=m, gpus=c.gpus, pp=c.pp, interleave=c.interleave, rounds=c.pipeline_rounds, dense=dense, moe=moe,
        embedding=embedding, head=head_spans, p2p_s=p2p_s, p2p_one=p2p_one,
        p2p_fill=p2p_fill, stage_blocks=blocks, stage_exists=exists,
        holds_head=holds_head, held=held,
        stage_params=stage_params, critical=critical, dp_sizes=dp, dp=dp_terms,
        critical_blocks=critical_dense + critical_moe,
        optimizer_s=optimizer_s, gathered_layer_bytes=2 * largest_layer * e,
        head_activation_bytes=g.tokens * vocab * (e + 4 + (4 if e < 4 else 0)),  # logits, fp32 log-probs and copy
        forward_only_bytes=np.maximum.reduce(np.broadcast_arrays(*[op.saved_bytes for op in dense_ops + moe_ops])))


def _pick(index: Any, values: Sequence[Any]) -> Any:
    """values[index] element-wise, for a stage index 0, 1 or 2."""
    return np.where(index == 0, values[0], np.where(index == 1, values[1], values[2]))
