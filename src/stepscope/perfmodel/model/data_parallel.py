"""Data-parallel communication as each training stack schedules it (`spec.stack`: megatron, ddp, after-backward,
fsdp): which buckets the gradients are reduced in, when each reduction starts and what it hides behind, when the
weights are gathered. Over numpy arrays.

`data_parallel_terms` prices the collectives of the pipeline stage holding the most parameters (level 1: what does
not depend on the ZeRO stage); `exposed` picks what each plan's ZeRO stage and its stack's schedule leave on the
critical path (level 2). The schedules, with their sources: docs/model.md, "The training stack".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.perfmodel.model.collectives import collective_time
from stepscope.perfmodel.model.schedule import gradient_reductions, size_buckets, zero3_gathers
from stepscope.spec.system import Network

MEGATRON_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's smallest default bucket (`bucket_size = max(40_000_000, 1_000_000 * dp_size)` parameters)."""
MEGATRON_BUCKET_PER_RANK = 1_000_000
AFTER_BACKWARD_BUCKET = 5e8
"""DeepSpeed's default `reduce_bucket_size` (elements)."""


@dataclass(frozen=True)
class DataParallelTerms:
    """Seconds of the critical stage's data-parallel collectives, for every ZeRO stage."""

    bucketed: dict[str, tuple[Any, Any]]
    """(all buckets, last bucket) of reducing the stage's gradients (a megatron pipeline: one model chunk's) in the
    stack's buckets: `all-reduce` (ZeRO 0) and `reduce-scatter` (ZeRO >= 1)."""
    chunk: dict[str, Any]
    """One virtual-pipeline chunk's gradients as one bucket (megatron under a pipeline)."""
    experts: dict[str, Any]
    """The routed experts' gradients over their own group (launched first)."""
    replicas: tuple[Any, Any]
    """HSDP: (all, last) of all-reducing the reduced shards across the replicas."""
    gather: dict[str, tuple[Any, Any]]
    """(all, first bucket or chunk) of gathering the stage's weights: `updated` (ZeRO-1/2, 16-bit, after the
    optimizer) and `zero3` (before each pass; fp8 where the recipe casts before gathering)."""
    block_gather: Any
    """FSDP: gathering one transformer block's weights (ZeRO-3 bytes)."""
    block_reduce: Any
    """FSDP: reduce-scattering one block's gradients."""
    root_reduce: Any
    """FSDP: reduce-scattering the root unit (embedding, head) with the last block's."""
    chunks: Any
    """Virtual-pipeline chunks of the stage (megatron)."""


def data_parallel_terms(policy: str, layout: dict[str, Any], network: Network, sizes: dict[str, Any], *, params: Any,
                        experts: Any, blocks: Any, root: Any, zero3_bytes: Any, zero3_expert_bytes: Any,
                        act_bytes: int, grad_bytes: int, chunks: Any, bucket_cap_MiB: float,
                        bucket_elements: Any = None) -> DataParallelTerms:
    """Price the critical stage's collectives: `params` reduced over dp x cp (`experts` over their own group),
    `blocks` transformer blocks and `root` parameters of the embedding and head, `zero3_bytes` its weights as
    ZeRO-3 gathers them; `sizes` the group sizes (`layout.data_parallel_sizes`), `layout` their members per domain.
    `bucket_elements` (PyTorch DDP's planner: `predict --buckets torch`) replaces the `ddp` size buckets."""
    def time(kind: str, nbytes: Any, group: str, ranks: str | None = None) -> Any:
        return collective_time(kind, nbytes, sizes[ranks or group], layout[group], network)

    kinds = {"all-reduce": "dp_cp", "reduce-scatter": "shard"}
    chunk_params = params / chunks if policy == "megatron" else params
    if policy == "megatron":
        cap = np.maximum(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PER_RANK * sizes["dp_cp"])
    elif policy == "after-backward":
        cap = AFTER_BACKWARD_BUCKET
    else:
        cap = bucket_cap_MiB * 2**20 / grad_bytes

    def buckets(kind: str, group: str, total: Any, scale: Any = 1.0, ranks: str | None = None) -> tuple[Any, Any]:
        if bucket_elements and policy == "ddp" and group != "edp":
            times = [time(kind, b * scale * grad_bytes, group, ranks) for b in bucket_elements]
            return sum(times), times[-1]
        full, rest = size_buckets(total, cap)
        last = time(kind, rest * scale * grad_bytes, group, ranks)
        return full * time(kind, cap * scale * grad_bytes, group, ranks) + last, last

    bucketed = {kind: buckets(kind, group, chunk_params) for kind, group in kinds.items()}
    chunk = {kind: time(kind, params / chunks * grad_bytes, group) for kind, group in kinds.items()}
    expert_s = {kind: np.where(experts > 0, buckets(kind, "edp", experts, ranks="edp")[0], 0.0) for kind in kinds}
    replicas = buckets("all-reduce", "replica", params, 1.0 / sizes["shard"], ranks="replicas")
    first = np.minimum(1.0, (bucket_elements[0] if bucket_elements and policy == "ddp" else cap)
                       / np.maximum(chunk_params, 1e-300)) * chunk_params / np.maximum(params, 1e-300)
    gather = {}
    for name, nbytes, expert_bytes in (("updated", params * act_bytes, experts * act_bytes),
                                       ("zero3", zero3_bytes, zero3_expert_bytes)):
        total = time("all-gather", nbytes, "shard") + time("all-gather", expert_bytes, "edp")
        gather[name] = (total, time("all-gather", first * nbytes, "shard"))
    per_block = np.maximum(blocks, 1)
    block_weights = (zero3_bytes - root * act_bytes) / per_block
    block_params = (params - root) / per_block
    return DataParallelTerms(
        bucketed=bucketed, chunk=chunk, experts=expert_s, replicas=replicas, gather=gather,
        block_gather=time("all-gather", block_weights, "shard") + time("all-gather", zero3_expert_bytes / per_block,
                                                                       "edp"),
        block_reduce=time("reduce-scatter", block_params * grad_bytes, "shard")
        + time("reduce-scatter", experts / per_block * grad_bytes, "edp"),
        root_reduce=time("reduce-scatter", (root + block_params) * grad_bytes, "shard"), chunks=chunks)


def _hidden(total: Any, last: Any, window: Any, share: float) -> Any:
    """What `total` seconds of buckets launched over a `window` of compute leave exposed, the last bucket launched
    at its end: the part the window cannot hold, at least the last bucket, plus the SM share of what it hides."""
    hidden = np.maximum(0.0, np.minimum(total - last, window))
    return total - hidden + share * hidden


@dataclass(frozen=True)
class Windows:
    """The compute a step's data-parallel collectives can hide behind (seconds, per plan)."""

    forward: Any
    """One micro-batch's forward of the critical-path stage."""
    backward: Any
    """One micro-batch's backward of that stage."""
    p2p: Any
    """One pipeline send between stages."""
    optimizer: Any
    """The optimizer step of the stage's shard."""
    blocks: Any
    """Transformer blocks of the stage (FSDP units)."""


def exposed(policy: str, T: DataParallelTerms, w: Windows, *, zero: Any, pp: Any, interleave: Any, rounds: Any,
            micro_batches: Any, backward: bool, train: bool, reshard_after_forward: bool, overlap: bool,
            share: float) -> tuple[Any, Any]:
    """(gradient reduction, weight gathers) seconds a step shows, per plan (`zero` per member). Without `overlap`
    every collective shows, in the stack's buckets."""
    reductions = gradient_reductions(pp, rounds, zero, micro_batches)
    replica_rounds = np.where(pp == 1, 1, rounds)  # HSDP's all-reduce of the shards: once per pipeline round
    forwards, backwards = zero3_gathers(pp, rounds, micro_batches, backward, reshard_after_forward)
    sharded = zero >= 1
    updated_total, updated_first = T.gather["updated"]
    if not overlap:
        total = np.where(sharded, T.bucketed["reduce-scatter"][0] + T.experts["reduce-scatter"],
                         T.bucketed["all-reduce"][0] + T.experts["all-reduce"])
        reduce_s = reductions * total + np.where(sharded, replica_rounds * T.replicas[0], 0.0)
        zero3_s, updated_s = (forwards + backwards) * T.gather["zero3"][0], updated_total
    else:
        def per_reduction(kind: str) -> Any:  # what depends on the kind alone, then picked per ZeRO stage
            kind_total, kind_last = T.bucketed[kind]
            if policy == "after-backward":
                return kind_total + T.experts[kind]
            if policy == "megatron":
                return _megatron_reduce(kind_total, kind_last, T.chunk[kind], T.experts[kind], w, pp, interleave,
                                        share)
            return _hidden(kind_total + T.experts[kind], kind_last, w.backward, share)

        reduce_s = reductions * np.where(sharded, per_reduction("reduce-scatter"), per_reduction("all-reduce"))
        replicas = replica_rounds * _hidden(*T.replicas, w.backward, share)
        reduce_s = reduce_s + np.where(sharded, replicas, 0.0)
        updated_s = _updated_gather(policy, updated_total, updated_first, w, interleave, T.chunks, share)
        if policy == "ddp":  # ZeRO-3's weights in size buckets, behind each pass but for the first bucket
            weights_s, first_s = T.gather["zero3"]
            zero3_s = (forwards * np.maximum(weights_s - w.forward, first_s)
                       + backwards * np.maximum(weights_s - w.backward, first_s))
        else:  # ZeRO-3 under the other stacks, and FSDP's ZeRO-2: FSDP units, block by block
            gather_fwd, gather_bwd, block_reduce = _blocks(T, w, share, np.asarray(backwards) > 0)
            zero3_s = forwards * gather_fwd + backwards * gather_bwd
            units = (zero == 3) | ((zero == 2) & (policy == "fsdp"))
            reduce_s = np.where(units, reductions * block_reduce + replicas, reduce_s)
    return reduce_s, np.where(zero == 3, zero3_s, np.where(sharded & train, updated_s, 0.0))


def _updated_gather(policy: str, total: Any, first: Any, w: Windows, interleave: Any, chunks: Any,
                    share: float) -> Any:
    """What gathering the updated 16-bit weights after the optimizer (ZeRO-1/2) shows: all of it in DeepSpeed's
    step; behind the next forward but for its first bucket; Megatron-Core interleaved, the first chunk's behind the
    other chunks' optimizer step (`overlap_param_gather_with_optimizer_step`), the rest behind the forward."""
    behind_forward = _hidden(total, first, w.forward, share)
    if policy == "after-backward":
        return total
    if policy == "megatron":
        first_chunk = np.maximum(0.0, total / chunks - (chunks - 1) / chunks * w.optimizer)
        return np.where(interleave > 1, first_chunk + share * (total - total / chunks), behind_forward)
    return behind_forward


def _blocks(T: DataParallelTerms, w: Windows, share: float, gathers_in_backward: Any) -> tuple[Any, Any, Any]:
    """FSDP's per-block collectives: (gathers of a forward, of a backward, reduce-scatters of a backward). Each
    block's gather is issued while the previous block computes: the first shows, the others by what exceeds
    one block's compute; in the backward a block's gather (where the weights were resharded) and the previous
    block's reduce-scatter share the same links, so the reduce-scatter hides only behind what the gather leaves of
    the block's compute; the last reduce-scatter (with the root's embedding and head) shows after the backward."""
    blocks = np.maximum(w.blocks, 1)
    later = blocks - 1

    def behind(collective: Any, window: Any) -> Any:
        return later * (np.maximum(0.0, collective - window) + share * np.minimum(collective, window))

    forward_block, backward_block = w.forward / blocks, w.backward / blocks
    left = np.maximum(0.0, backward_block - np.where(gathers_in_backward, T.block_gather, 0.0))
    return (T.block_gather + behind(T.block_gather, forward_block),
            T.block_gather + behind(T.block_gather, backward_block),
            T.root_reduce + behind(T.block_reduce, left))


def _megatron_reduce(total: Any, last: Any, chunk: Any, experts: Any, w: Windows, pp: Any, interleave: Any,
                     share: float) -> Any:
    """Megatron-Core's reductions, in seconds after the end of the first pipeline rank's backward (module
    docstring): the experts' reduction goes out with the first chunk's; chunks v−1..1 are launched c·p chunk-slots
    before the end on one stream; the first rank's chunk 0 in buckets behind its last chunk-slot, the second
    rank's as one bucket, that rank ending a chunk-slot and a send earlier. The SM share of what hides is added."""
    slot = w.backward / interleave  # one micro-batch's backward of one model chunk
    earlier = np.where(pp > 1, slot + w.p2p, 0.0)
    launch = -(interleave - 1) * pp * slot - slot
    # the stream's chain, F = max(L_c, F) + chunk for c = v-1..1 from F = launch + experts, in closed form: the
    # chain ends either after every chunk from its start, or after the c chunks from chunk c's launch -c·p·slot,
    # c·(chunk − p·slot) at its largest (c = v−1 when chunks outlast their slots, else c = 1)
    gap = chunk - pp * slot
    last_launch = np.where(gap > 0, (interleave - 1) * gap, gap)
    chain = np.where(interleave > 1, np.maximum(launch + experts + (interleave - 1) * chunk, last_launch),
                     launch + experts)
    begin = np.maximum(chain, -slot)
    hidden = np.maximum(0.0, np.minimum(-begin, total - last))  # chunk 0's buckets that run inside its window
    rank0 = np.maximum(begin + total, last)
    rank1 = np.where(pp > 1, np.maximum(chain - earlier, -earlier) + chunk, -np.inf)
    overlapped = experts + (interleave - 1) * chunk + hidden  # what ran beside backward compute
    return np.maximum(0.0, np.maximum(rank0, rank1)) + share * overlapped
