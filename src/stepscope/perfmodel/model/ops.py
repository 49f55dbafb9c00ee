"""Per-op accounting of one micro-batch on one GPU: FLOPs (executed and MFU), HBM bytes, saved activations,
parameters, kernels and collectives, forward and backward separately, of every op of a dense block, the embedding
and the head. Numbers only; turning them into time is `rates`. A Mixture-of-Experts block is `ops_moe`.

The conventions (matrix ops and their three passes, fused and unfused attention, elementwise ops, Korthikanti et
al.'s activations, Megatron's tensor parallelism, fp8, kernel counts) are in docs/model.md, "Ops"; they are the
reference the parameter and FLOP counts of `ModelSpec` and `TransformerLM` are tested against.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.op_types import Collective, Cost, Geometry, Op
from stepscope.spec import ModelSpec

__all__ = ["VECTOR_BACKWARD", "VECTOR_FLOPS", "Collective", "Cost", "Geometry", "Op", "activation_precision",
           "attention_block", "attention_ops", "embedding_ops", "fp8_casts", "head_ops", "layer_ops", "mlp_block"]

# Nominal elementwise FLOPs per element (what a vector unit does; not counted in MFU).
VECTOR_FLOPS = {"norm": 5.0, "rope": 3.0, "softmax": 5.0, "dropout": 2.0, "residual": 1.0, "swiglu": 6.0,
                "gelu": 10.0, "embedding": 1.0, "loss": 5.0, "permute": 1.0, "combine": 2.0}
# Backward of an elementwise op relative to its forward (bytes and FLOPs), from what it reads and writes:
# a norm reads x and dy and writes dx (3 tensors vs 2); a residual add's gradient passes through (one
# accumulation, as many tensors as forward); softmax reads p and dy, writes dx; SwiGLU reads dy, gate and
# up and writes two gradients (5 vs 3); GELU reads x and dy, writes dx; dropout and rotary replay their
# forward on the gradient.
VECTOR_BACKWARD = {"norm": 1.5, "rope": 1.0, "softmax": 1.5, "dropout": 1.0, "residual": 1.0, "swiglu": 5 / 3,
                   "gelu": 1.5, "permute": 1.0, "combine": 1.5}
ROPE_KERNELS_PER_TENSOR = 7


def activation_precision(precision: str) -> str:
    """What activations, attention and elementwise ops run in: fp8 training keeps them in bf16."""
    return "bf16" if precision == "fp8" else precision


def gemm_passes(m: Any, k: Any, n: Any, groups: Any = 1) -> tuple[tuple, tuple]:
    """The GEMMs of a linear layer y[m, n] = x[m, k] · w[k, n] (G of them when grouped): forward (m, n, k);
    backward the input gradient dx = dy · wᵀ (m, k, n) and the weight gradient dw = xᵀ · dy (k, n, m)."""
    return ((m, n, k, groups),), ((m, k, n, groups), (k, n, m, groups))


def _matrix(name: str, block: str, m: float, k: float, n: float, e: int, *, params: float, saved: float,
            fwd_comms: tuple[Collective, ...] = (), bwd_comms: tuple[Collective, ...] = (), fp8: bool = False) -> Op:
    """A GEMM; an fp8 one reads 1-byte inputs and weights (its output stays 16-bit)."""
    flops = 2.0 * m * k * n
    moved = ((m * k + k * n) * (1 if fp8 else e) + m * n * e)
    forward, backward = gemm_passes(m, k, n)
    return Op(name, block, "matrix", Cost(flops, flops, moved, 1, fwd_comms, forward),
              Cost(2 * flops, 2 * flops, 2 * moved, 2, bwd_comms, backward), saved_bytes=saved, params=params,
              fp8=fp8)


# fp8 casts (Transformer Engine's cast-transpose): every fp8 GEMM input is read in 16 bits and written in fp8
# twice (as is and transposed, for the weight- or input-gradient GEMM), with its scale from an amax: the
# recipe decides whether that amax costs another read of the tensor (current scaling) or comes from history
# (delayed) or per 1x128 / 128x128 block inside the cast kernel (blockwise). Two kernels per cast (cast and
# amax/scale bookkeeping); weights are cast every micro-batch (no caching across micro-batches).
FP8_CAST_BYTES = {"delayed": 2 + 1 + 1, "current": 2 + 2 + 1 + 1, "blockwise": 2 + 1 + 1}
FP8_CAST_FLOPS = 2.0  # amax and scale per element
FP8_CAST_KERNELS = 2


def fp8_casts(name: str, block: str, g: Geometry, forward_elements: float, forward_tensors: int,
              backward_elements: float, backward_tensors: int) -> Op:
    """The casts of one block's fp8 GEMMs: inputs and weights forward, output gradients backward."""
    per_element = FP8_CAST_BYTES[g.fp8_recipe or "delayed"]
    return Op(name, block, "vector",
              Cost(FP8_CAST_FLOPS * forward_elements, 0.0, per_element * forward_elements,
                   FP8_CAST_KERNELS * forward_tensors),
              Cost(FP8_CAST_FLOPS * backward_elements, 0.0, per_element * backward_elements,
                   FP8_CAST_KERNELS * backward_tensors))


def _vector(name: str, block: str, kind: str, elements: float, moved: float, *, per_element: float | None = None,
            saved: float = 0.0, kernels: int = 1, params: float = 0.0, fwd_comms: tuple[Collective, ...] = (),
            bwd_comms: tuple[Collective, ...] = (), saved_selective: float | None = None,
            selective: bool = False) -> Op:
    flops = (VECTOR_FLOPS[kind] if per_element is None else per_element) * elements
    back = VECTOR_BACKWARD[kind]
    return Op(name, block, "vector", Cost(flops, 0.0, moved, kernels, fwd_comms),
              Cost(back * flops, 0.0, back * moved, kernels, bwd_comms), saved_bytes=saved,
              saved_selective_bytes=saved_selective, params=params, selective=selective)


def _tp_entry_exit(g: Geometry, width: float) -> tuple[tuple, tuple, tuple, tuple]:
    """Collectives around a TP block: (entry fwd, entry bwd, exit fwd, exit bwd) for its (tokens x width): with
    sequence parallelism an all-gather in and a reduce-scatter out (their gradients the other way round), without
    it one all-reduce out forward and one in backward. Both kinds are listed; the plan's sequence parallelism
    gives the other kind no bytes."""
    nbytes = g.tokens * width * g.act_bytes
    sp, ar = np.where(g.sequence_parallel, nbytes, 0.0), np.where(g.sequence_parallel, 0.0, nbytes)
    gather, scatter = Collective("all-gather", sp, "tp", g.tp), Collective("reduce-scatter", sp, "tp", g.tp)
    reduce = Collective("all-reduce", ar, "tp", g.tp)
    return (gather,), (scatter, reduce), (scatter, reduce), (gather,)


def attention_block(spec: ModelSpec, g: Geometry) -> list[Op]:
    """Norm, QKV projection, rotary, attention core (fused, or scores/softmax/dropout/values), output
    projection, dropout + residual: the ops of one attention block."""
    h, q, kv, e, t = spec.d_model, spec.q_dim, spec.kv_dim, g.act_bytes, g.tp
    tokens, sharded = g.tokens, g.sharded_tokens
    qkv_width = (q + 2 * kv) / t
    entry_fwd, entry_bwd, exit_fwd, exit_bwd = _tp_entry_exit(g, h)
    mask = 1 if g.dropout else 0
    ops = [_vector("attn_norm", "attention", "norm", sharded * h, 2 * sharded * h * e,
                   saved=sharded * h * e, params=spec.norm_params())]
    qkv_bias = (q + 2 * kv) / t if spec.attn_bias else 0.0
    # the entry collective belongs to the QKV GEMM: it is what an overlapping implementation hides it behind
    ops.append(_matrix("qkv", "attention", tokens, h, qkv_width, e, params=h * qkv_width + qkv_bias,
                       saved=sharded * h * g.gemm_input_bytes, fwd_comms=entry_fwd, bwd_comms=entry_bwd, fp8=g.fp8))
    if spec.positions == "rope":
        rotated = tokens * (q + kv) / t
        ops.append(_vector("rope", "attention", "rope", rotated, 2 * rotated * e,
                           kernels=2 * ROPE_KERNELS_PER_TENSOR))
    ops.extend(attention_ops(spec, g))
    out_bias = h if spec.attn_bias else 0.0  # row-parallel bias: replicated, added after the reduction
    ops.append(_matrix("attn_out", "attention", tokens, q / t, h, e, params=q * h / t + out_bias,
                       saved=tokens * q / t * g.gemm_input_bytes, fwd_comms=exit_fwd, bwd_comms=exit_bwd, fp8=g.fp8))
    if g.fp8:
        ops.append(fp8_casts("attn_fp8_casts", "attention", g, tokens * h + h * qkv_width + tokens * q / t + q * h / t,
                             4, tokens * qkv_width + tokens * h, 2))
    ops.append(_vector("attn_residual", "attention", "residual", sharded * h, sharded * h * (3 * e + mask),
                       per_element=VECTOR_FLOPS["residual"] + (VECTOR_FLOPS["dropout"] if g.dropout else 0.0),
                       saved=sharded * h * mask))
    return ops


def attention_ops(spec: ModelSpec, g: Geometry) -> list[Op]:
    """The attention core: one fused flash op, or scores, softmax, (dropout,) values."""
    h, kv, e, t = spec.q_dim, spec.kv_dim, g.act_bytes, g.tp  # h: the attention width n_heads x head_dim
    tokens, heads = g.tokens, spec.n_heads / t
    queries = g.micro_batch * g.seq / g.cp  # each context-parallel rank owns seq/cp queries of every sequence
    square_flops = 2.0 * queries * g.seq * h / t  # one s x s matmul (QKᵀ or PV) over all local heads, unmasked
    qk_bytes, v_bytes = tokens * (h + kv) / t * e, tokens * kv / t * e
    gathered = 2 * g.micro_batch * g.seq * kv / t * e  # every rank's K and V
    cp_fwd = (Collective("all-gather", gathered, "cp", g.cp),)
    cp_bwd = (Collective("reduce-scatter", gathered, "cp", g.cp),)
    if g.flash_attention:
        lse = 4.0 * heads * queries  # fp32 log-sum-exp per query and local head
        forward = square_flops  # two causal halves: QKᵀ and PV
        moved = tokens * (2 * h + 2 * kv) / t * e  # read q, k, v; write o
        cp_fwd, cp_bwd, kernels = context_parallel(spec, g, gathered)
        ops = [Op("flash_attention", "attention", "attention",
                  Cost(forward, forward, moved + lse, kernels, cp_fwd),
                  Cost(2.5 * forward, 2.0 * forward, 2 * moved + lse, kernels, cp_bwd),
                  saved_bytes=qk_bytes + v_bytes + lse)]
        if g.context_parallel in CP_MERGE_PASSES:
            ops.append(_cp_merge(spec, g))
        return ops
    scores = heads * queries * g.seq  # s x s elements per local head and sequence
    mask = 1 if g.dropout else 0
    # batched over the local heads of each sequence: S = Q·Kᵀ (s/cp x s, inner head_dim), O = P·V
    rows, batch, head_dim = g.seq / g.cp, heads * g.micro_batch, spec.head_dim
    ops = [Op("scores", "attention", "matrix",
              Cost(square_flops, square_flops / 2, qk_bytes + scores * e, 1, cp_fwd, ((rows, g.seq, head_dim, batch),)),
              Cost(2 * square_flops, square_flops, 2 * (qk_bytes + scores * e), 2, cp_bwd,
                   ((rows, head_dim, g.seq, batch), (g.seq, head_dim, rows, batch))),
              saved_bytes=qk_bytes, selective=True),
           _vector("softmax", "attention", "softmax", scores, 2 * scores * e, saved=scores * e,
                   saved_selective=0.0, selective=True)]
    if g.dropout:
        ops.append(_vector("attn_dropout", "attention", "dropout", scores, scores * (2 * e + mask),
                           saved=scores * (e + mask), saved_selective=0.0, selective=True))
    ops.append(Op("values", "attention", "matrix",
                  Cost(square_flops, square_flops / 2, scores * e + v_bytes + tokens * h / t * e, 1, (),
                       ((rows, head_dim, g.seq, batch),)),
                  Cost(2 * square_flops, square_flops, 2 * (scores * e + v_bytes + tokens * h / t * e), 2, (),
                       ((rows, g.seq, head_dim, batch), (g.seq, head_dim, rows, batch))),
                  saved_bytes=v_bytes, selective=True))
    return ops


CP_MERGE_PASSES = {"p2p-ring": 1, "torch-all-gather": 6}
"""fp32 passes over a rank's attention output per ring step that merge the step's partial result (rescale by the
log-sum-exp, add) and show: Transformer Engine corrects on a second stream, half of its two passes hidden
(`AttnFuncWithCPAndKVP2P`); PyTorch's `_SDPAMerger` (convert_to_f32) runs about six on the compute stream."""


def context_parallel(spec: ModelSpec, g: Geometry, gathered: Any) -> tuple[tuple, tuple, Any]:
    """(forward collectives, backward collectives, kernels) of fused attention under context parallelism, as the
    stack exchanges K/V (`spec.stack.StackSpec.context_parallel`), each rank holding seq/cp queries, the causal work
    balanced by two chunks per rank (Transformer Engine's DualChunkSwap, Llama 3 §3.3.2, PyTorch's round-robin):
    - `p2p-ring` (Transformer Engine): cp steps, one kernel each on the K/V block that arrived; while step i
      computes, the next block (K and V of seq/cp tokens) goes to the neighbour, so each of the cp − 1 sends hides
      behind 1/cp of the attention; backward sends K/V and their gradients (twice the bytes) behind its steps;
    - `all-gather` (Llama 3, Transformer Engine's all_gather): K/V all-gathered before attention and their gradients
      reduce-scattered after it, exposed (K/V gathered again for backward); two kernels (one per query chunk);
    - `torch-all-gather` (PyTorch's context parallelism): one all-gather of K/V repeated to every query head, issued
      before the first step and waited after it (behind 1/cp of the attention); cp kernels."""
    if g.context_parallel == "p2p-ring":
        block = gathered / np.maximum(g.cp, 1)
        steps, share = g.cp - 1, 1.0 / g.cp
        return ((Collective("ring-step", block, "cp", g.cp, "always", repeats=steps, window_share=share),),
                (Collective("ring-step", 2 * block, "cp", g.cp, "always", repeats=steps, window_share=share),),
                g.cp)
    if g.context_parallel == "all-gather":
        gather = Collective("all-gather", gathered, "cp", g.cp, "never")
        return (gather,), (gather, Collective("reduce-scatter", gathered, "cp", g.cp, "never")), np.minimum(g.cp, 2)
    repeated = gathered * spec.n_heads / spec.n_kv_heads
    gather = Collective("all-gather", repeated, "cp", g.cp, "always", window_share=1.0 / g.cp)
    return ((gather,), (gather, Collective("reduce-scatter", repeated, "cp", g.cp, "always", window_share=1.0 / g.cp)),
            g.cp)


def _cp_merge(spec: ModelSpec, g: Geometry) -> Op:
    """The per-step merges of the ring's partial attention outputs (fp32, `CP_MERGE_PASSES`), forward and backward
    (the backward accumulates its partial gradients the same way); none without context parallelism."""
    passes = CP_MERGE_PASSES[g.context_parallel] * (g.cp - 1)
    elements = g.tokens * spec.q_dim / g.tp
    return _vector("cp_merge", "attention", "residual", elements * passes, 8.0 * elements * passes,
                   kernels=passes, per_element=1.0)


def mlp_block(spec: ModelSpec, g: Geometry) -> list[Op]:
    """Norm, up (and gate) projection, activation, down projection, dropout + residual."""
    h, f, e, t = spec.d_model, spec.d_ff, g.act_bytes, g.tp
    tokens, sharded = g.tokens, g.sharded_tokens
    gated = spec.mlp == "swiglu"
    up_width = (2 if gated else 1) * f / t
    entry_fwd, entry_bwd, exit_fwd, exit_bwd = _tp_entry_exit(g, h)
    mask = 1 if g.dropout else 0
    ops = [_vector("mlp_norm", "mlp", "norm", sharded * h, 2 * sharded * h * e,
                   saved=sharded * h * e, params=spec.norm_params())]
    ops.append(_matrix("mlp_up", "mlp", tokens, h, up_width, e,
                       params=h * up_width + (up_width if spec.mlp_bias else 0.0),
                       saved=sharded * h * g.gemm_input_bytes, fwd_comms=entry_fwd, bwd_comms=entry_bwd, fp8=g.fp8))
    hidden = tokens * f / t
    if gated:  # silu(gate) * up: reads both halves, writes one; keeps both for backward
        ops.append(_vector("swiglu", "mlp", "swiglu", hidden, 3 * hidden * e, saved=2 * hidden * e,
                           kernels=2))
    else:
        ops.append(_vector("gelu", "mlp", "gelu", hidden, 2 * hidden * e, saved=hidden * e))
    ops.append(_matrix("mlp_down", "mlp", tokens, f / t, h, e,
                       params=f / t * h + (h if spec.mlp_bias else 0.0), saved=hidden * g.gemm_input_bytes,
                       fwd_comms=exit_fwd, bwd_comms=exit_bwd, fp8=g.fp8))
    if g.fp8:
        ops.append(fp8_casts("mlp_fp8_casts", "mlp", g, tokens * h + h * up_width + hidden + f / t * h, 4,
                             tokens * up_width + tokens * h, 2))
    ops.append(_vector("mlp_residual", "mlp", "residual", sharded * h, sharded * h * (3 * e + mask),
                       per_element=VECTOR_FLOPS["residual"] + (VECTOR_FLOPS["dropout"] if g.dropout else 0.0),
                       saved=sharded * h * mask))
    return ops


def layer_ops(spec: ModelSpec, g: Geometry) -> list[Op]:
    """All ops of one transformer block."""
    return attention_block(spec, g) + mlp_block(spec, g)


def embedding_ops(spec: ModelSpec, g: Geometry) -> list[Op]:
    """Token embedding (vocabulary-parallel: partial rows, then a TP reduction) and learned positions."""
    h, e, t, tokens = spec.d_model, g.act_bytes, g.tp, g.tokens
    sp = g.sequence_parallel
    comms = (Collective("reduce-scatter", np.where(sp, tokens * h * e, 0.0), "tp", t),
              Collective("all-reduce", np.where(sp, 0.0, tokens * h * e), "tp", t))
    table = spec.vocab_size * h / t
    params = table + (spec.context_length * h if spec.positions == "learned" else 0.0)
    learned = spec.positions == "learned"
    forward = Cost(tokens * h * (1 + learned), 0.0, tokens * h * e * (2 + 3 * learned), 1 + learned, comms)
    # backward: a dense gradient of the (local) table is materialized, then rows are scattered into it
    backward = Cost(tokens * h, 0.0, table * 4 + 2 * tokens * h * e, 2)
    return [Op("embedding", "embedding", "vector", forward, backward, params=params)]


def head_ops(spec: ModelSpec, g: Geometry) -> list[Op]:
    """Final norm, vocabulary projection (vocabulary-parallel) and cross-entropy in fp32."""
    h, e, t = spec.d_model, g.act_bytes, g.tp
    tokens, sharded = g.tokens, g.sharded_tokens
    # sequence parallelism gathers the final norm's output for the vocabulary GEMM (reduce-scatter backward);
    # without it the GEMM's input gradient is all-reduced
    sp = g.sequence_parallel
    gather_fwd = (Collective("all-gather", np.where(sp, tokens * h * e, 0.0), "tp", t),)
    gather_bwd = (Collective("reduce-scatter", np.where(sp, tokens * h * e, 0.0), "tp", t),
                  Collective("all-reduce", np.where(sp, 0.0, tokens * h * e), "tp", t))
    ops = [_vector("final_norm", "head", "norm", sharded * h, 2 * sharded * h * e,
                   saved=sharded * h * e, params=spec.norm_params())]
    vocab = spec.vocab_size / t
    ops.append(_matrix("logits", "head", tokens, h, vocab, e, params=0.0 if spec.tie_embeddings else h * vocab,
                       saved=sharded * h * e, fwd_comms=gather_fwd, bwd_comms=gather_bwd))
    logits = tokens * vocab
    upcast = 8.0 if e < 4 else 0.0  # a 16-bit logit tensor is copied to fp32 before the loss
    loss_comms = (Collective("all-reduce", 3 * 4 * tokens, "tp", t),)
    forward = Cost(VECTOR_FLOPS["loss"] * logits, 0.0, logits * (e + upcast + 8), 3, loss_comms)
    backward = Cost(2 * VECTOR_FLOPS["loss"] * logits, 0.0, logits * (8 + (4 + e if e < 4 else 0)), 3)
    ops.append(Op("loss", "head", "vector", forward, backward, saved_bytes=logits * 4))
    return ops
