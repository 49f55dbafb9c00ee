"""Per-op accounting of one Mixture-of-Experts block on one GPU (the conventions of `ops`): router, top-k,
dispatch and combine over the expert-parallel group, the grouped expert GEMMs of the local experts scaled by the
busiest rank's imbalance, shared experts; expert weights 1/ep per GPU, reduced over their own group.

What the block holds and what is not modelled: docs/model.md, "Mixture-of-Experts"; the plan fields (ep,
expert-TP folding, dispatchers, imbalance): docs/perfmodel.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.ops import (
    VECTOR_FLOPS,
    Collective,
    Cost,
    Geometry,
    Op,
    _matrix,
    _tp_entry_exit,
    _vector,
    attention_block,
    fp8_casts,
    gemm_passes,
)
from stepscope.spec import ModelSpec

ROUTER_KERNELS = 3  # scores activation, top-k, normalisation of the k weights
PERMUTE_KERNELS = 2  # index computation (sort by expert) and the gather/scatter itself
HOST_SYNC_S = 20e-6 + 3 * 8e-6
"""A dropless router's per-layer wait on the host: the token counts copied to the host before the dispatch
(Megatron-Core's alltoall dispatcher syncs at `before_ep_alltoall`; Transformer Engine's grouped GEMM reads
`tokens_per_expert.tolist()`; DeepEP's normal dispatch waits for the received counts), about 20 µs of copy and
event, then the three fused kernels launched after it run no faster than the host launches them, about 8 µs
each (research estimates from Megatron-LM token_dispatcher.py and DeepEP's README; a GPU trace would settle them).
Forward only: the backward reuses the counts."""
MAIN_GRAD_BYTES = 8
"""Bytes per expert weight the weight-gradient GEMM moves into Megatron-Core's fp32 main_grad (read and write,
gradient_accumulation_fusion): with few tokens per expert this, not the FLOPs, bounds the weight gradient."""


def imbalance(spec: ModelSpec, g: Geometry) -> float:
    """Tokens of the busiest EP rank / the mean: the plan's, capped by a capacity-limited router, which drops
    what exceeds its capacity; 1 with one EP rank, whose GPU holds every expert (imbalance between experts
    then moves no work between GPUs)."""
    capped = min(g.expert_imbalance, spec.capacity_factor) if spec.capacity_factor else g.expert_imbalance
    return np.where(np.asarray(g.ep) == 1, 1.0, capped)


def routed_tokens(spec: ModelSpec, g: Geometry) -> tuple[float, float]:
    """(token copies through one GPU's local experts, token copies it sends in the dispatch all-to-all), both on
    the busiest EP rank."""
    busiest = imbalance(spec, g)
    # whole experts (expert_tp 1): no TP gather, a GPU's experts take the copies its own tokens send on average
    through = g.sharded_tokens if g.expert_tp == 1 else g.tokens
    return through * spec.experts_per_token * busiest, g.sharded_tokens * spec.experts_per_token * busiest


def _grouped(name: str, m: float, k: float, n: float, weights: float, e: int, *, params: float, saved: float,
             fwd_comms: tuple[Collective, ...], bwd_comms: tuple[Collective, ...], fp8: bool,
             busiest: float = 1.0, groups: Any = 1) -> Op:
    """A grouped GEMM: m rows in total over the local experts, each with its own k x n weight (`weights`
    elements in all); backward is two grouped GEMMs of the same size, as for `ops._matrix`. m is the busiest
    EP rank's, `busiest` times the mean: it sets the time, while the FLOPs counted for the model (and for
    hardware utilisation) are the mean rank's, since imbalance moves tokens between ranks without adding any."""
    flops = 2.0 * m * k * n
    moved = (m * k + weights) * (1 if fp8 else e) + m * n * e
    forward, backward = gemm_passes(m / groups, k, n, groups)  # `groups` local experts, m / groups tokens each
    # Transformer Engine runs one cuBLAS GEMM per local expert (multi_stream_cublas_gemm, 4 streams) by default
    return Op(name, "moe", "matrix", Cost(flops, flops / busiest, moved, groups, fwd_comms, forward),
              Cost(2 * flops, 2 * flops / busiest, 2 * moved + MAIN_GRAD_BYTES * weights, 2 * groups, bwd_comms,
                   backward), saved_bytes=saved, params=params, fp8=fp8, expert=True)


def moe_block(spec: ModelSpec, g: Geometry) -> list[Op]:
    """Norm, router, dispatch, expert GEMMs, combine, shared experts, residual: one MoE block on one GPU."""
    h, fe, e, t, ep = spec.d_model, spec.expert_d_ff, g.act_bytes, g.expert_split, g.ep
    n, sharded, tokens = spec.n_experts, g.sharded_tokens, g.tokens
    gated = spec.mlp == "swiglu"
    up = (2 if gated else 1) * fe / t  # local width of the (gate and) up projection of one expert
    local = n / ep
    routed, sent = routed_tokens(spec, g)
    busiest = imbalance(spec, g)
    mask = 1 if g.dropout else 0
    a2a_fwd, a2a_bwd, back_fwd = _exchanges(spec, g, sent)
    gather = (Collective("all-gather", routed * h * e, "tp", t),)
    scatter = (Collective("reduce-scatter", routed * h * e, "tp", t),)
    ops = [_vector("moe_norm", "moe", "norm", sharded * h, 2 * sharded * h * e, saved=sharded * h * e,
                   params=spec.norm_params()),
           _matrix("router", "moe", sharded, h, n, e, params=h * n, saved=sharded * h * e),
           _vector("router_topk", "moe", "softmax", sharded * n, 2 * sharded * n * e, saved=sharded * n * e,
                   kernels=ROUTER_KERNELS),
           _vector("dispatch", "moe", "permute", sent * h, (sharded + sent) * h * e, kernels=PERMUTE_KERNELS,
                   fwd_comms=a2a_fwd, bwd_comms=a2a_bwd)]
    if not spec.capacity_factor:  # dropless: the dispatch needs the token counts on the host
        ops.append(Op("token_count_sync", "moe", "vector", Cost(kernels=0, latency_s=HOST_SYNC_S),
                      Cost(kernels=0)))
    # the received copies regrouped by local expert and back (Megatron-Core's sort_chunks_by_idxs, or the flex
    # dispatcher's local permute after the exchange): two more passes over them each way
    regroup = np.where((np.asarray(ep) > 1) & (local > 1), routed * h, 0.0)
    ops.append(_vector("expert_regroup", "moe", "permute", regroup, 4 * regroup * e, kernels=2))
    bias_up, bias_down = (up, h) if spec.mlp_bias else (0.0, 0.0)
    ops.append(_grouped("expert_up", routed, h, up, local * h * up, e, params=local * (h * up + bias_up),
                        saved=routed * h * g.gemm_input_bytes, fwd_comms=gather, bwd_comms=scatter, fp8=g.fp8,
                        busiest=busiest, groups=local))
    hidden = routed * fe / t
    ops.append(_activation("expert", hidden, e, gated))
    ops.append(_grouped("expert_down", routed, fe / t, h, local * fe / t * h, e,
                        params=local * (fe / t * h + bias_down), saved=hidden * g.gemm_input_bytes,
                        fwd_comms=scatter, bwd_comms=gather, fp8=g.fp8, busiest=busiest, groups=local))
    ops.append(_vector("combine", "moe", "combine", sent * h, (sent + sharded) * h * e, saved=sent * h * e,
                       kernels=PERMUTE_KERNELS, fwd_comms=back_fwd, bwd_comms=a2a_bwd))
    fp8_fwd = routed * h + local * h * up + hidden + local * fe / t * h
    fp8_bwd = routed * up + routed * h
    if spec.n_shared_experts:
        ops += _shared_experts(spec, g)
        fs = spec.n_shared_experts * fe / g.tp  # the shared experts stay split over tp like the dense MLP
        fp8_fwd += tokens * h + h * fs * (2 if gated else 1) + tokens * fs + fs * h
        fp8_bwd += tokens * fs * (2 if gated else 1) + tokens * h
    if g.fp8:
        tensors = 4 + (4 if spec.n_shared_experts else 0)
        ops.append(fp8_casts("moe_fp8_casts", "moe", g, fp8_fwd, tensors, fp8_bwd, tensors // 2))
    ops.append(_vector("moe_residual", "moe", "residual", sharded * h, sharded * h * (3 * e + mask),
                       per_element=VECTOR_FLOPS["residual"] + (VECTOR_FLOPS["dropout"] if g.dropout else 0.0),
                       saved=sharded * h * mask))
    return ops


def _exchanges(spec: ModelSpec, g: Geometry, sent: float) -> tuple[tuple[Collective, ...], ...]:
    """The EP group's token exchanges: (forward dispatch, every backward one, forward combine). The `alltoall`
    dispatcher sends the `sent` token copies by all-to-all; `deepep` sends each token once per domain holding
    one of its experts (`collectives.dispatch`); `deepep-fp8` sends the forward dispatch in fp8 when the GEMMs
    are fp8 (the combine and the gradients stay 16-bit, as in DeepSeek-V3)."""
    h, e, k = spec.d_model, g.act_bytes, spec.experts_per_token
    if g.dispatcher == "alltoall":
        a2a = (Collective("all-to-all", sent * h * e, "ep", g.ep, overlap="never"),)
        return a2a, a2a, a2a
    reach = (spec.expert_groups, spec.groups_per_token)

    def exchange(element_bytes: int) -> tuple[Collective, ...]:
        return (Collective("dispatch", sent / k * h * element_bytes, "ep", g.ep, overlap="never", copies=k,
                           reach=reach),)

    return exchange(1 if g.fp8 and g.dispatcher == "deepep-fp8" else e), exchange(e), exchange(e)


def _shared_experts(spec: ModelSpec, g: Geometry) -> list[Op]:
    """The shared experts as one dense MLP of n_shared x expert_d_ff (tensor-parallel like the dense MLP)."""
    h, e, t = spec.d_model, g.act_bytes, g.tp
    tokens, sharded = g.tokens, g.sharded_tokens
    f = spec.n_shared_experts * spec.expert_d_ff
    gated = spec.mlp == "swiglu"
    up = (2 if gated else 1) * f / t
    entry_fwd, entry_bwd, exit_fwd, exit_bwd = _tp_entry_exit(g, h)
    bias_up, bias_down = (up, h) if spec.mlp_bias else (0.0, 0.0)
    ops = [_matrix("shared_up", "moe", tokens, h, up, e, params=h * up + bias_up,
                   saved=sharded * h * g.gemm_input_bytes, fwd_comms=entry_fwd, bwd_comms=entry_bwd, fp8=g.fp8)]
    hidden = tokens * f / t
    ops.append(_activation("shared", hidden, e, gated))
    ops.append(_matrix("shared_down", "moe", tokens, f / t, h, e, params=f / t * h + bias_down,
                       saved=hidden * g.gemm_input_bytes, fwd_comms=exit_fwd, bwd_comms=exit_bwd, fp8=g.fp8))
    return ops


def moe_layer_ops(spec: ModelSpec, g: Geometry) -> list[Op]:
    """All ops of one MoE transformer block: the attention block, then the MoE block."""
    return attention_block(spec, g) + moe_block(spec, g)


def _activation(prefix: str, hidden: float, e: int, gated: bool) -> Op:
    """The experts' activation over `hidden` elements: SwiGLU reads gate and up and writes one (two kernels),
    GELU reads and writes one."""
    if gated:
        return _vector(f"{prefix}_swiglu", "moe", "swiglu", hidden, 3 * hidden * e, saved=2 * hidden * e, kernels=2)
    return _vector(f"{prefix}_gelu", "moe", "gelu", hidden, 2 * hidden * e, saved=hidden * e)
