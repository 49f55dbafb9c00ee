"""The Triton kernels of FlashAttention-2 (forward, D preprocessing, dK/dV pass, dQ pass).

Imported only by `stepscope.kernels.flash_triton`, which launches them. Layout: q, k, v, o and their
gradients are (BH, N, d) with unit stride along d; L (logsumexp, natural log) and D are (BH, Nq) fp32.
Grid: (tiles along the sequence, batch·heads). Scores are kept in log2 units (`qk_scale` =
log2(e)/√d) so that every exponential is the cheaper `exp2`.

Causal masks are aligned top-left (key j visible to query i when j <= i). Tiles entirely above the
diagonal are never loaded; tiles entirely below it run without a mask; only tiles crossing it are
masked. Each loop is a `_*_tiles` helper called once per tile class, with the class as a constexpr,
so the unmasked loop carries no mask arithmetic. Ragged ends are handled by masked loads and stores
(zero rows contribute nothing where they are multiplied by zero; the forward and the dQ pass mask
keys beyond Nk only when Nk is not a multiple of the key tile, `EVEN_K`).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Globals a kernel reads must be constexpr: the GPU compiler refuses plain Python globals (Triton's interpreter,
# which runs these kernels on CPU, accepts them, so only a GPU found this).
MASKED = tl.constexpr(-1.0e6)  # a masked pair's score: exp2(-1e6 - m) == 0, never NaN as -inf - -inf would be
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, offs_q, offs_d, lo, hi, n_keys, qk_scale,
               CAUSAL_MASK: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr,
               PRECISION: tl.constexpr):
    """Online softmax over key tiles [lo, hi) for one block of queries."""
    for start_k in range(lo, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        if EVEN_K:
            k_t = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None])
            v = tl.load(v_base + offs_k[:, None] * stride_kn + offs_d[None, :])
        else:
            k_t = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None],
                          mask=offs_k[None, :] < n_keys, other=0.0)
            v = tl.load(v_base + offs_k[:, None] * stride_kn + offs_d[None, :],
                        mask=offs_k[:, None] < n_keys, other=0.0)
        s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
        if not EVEN_K:
            s = tl.where(offs_k[None, :] < n_keys, s, MASKED)
        if CAUSAL_MASK:
            s = tl.where(offs_k[None, :] <= offs_q[:, None], s, MASKED)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(Q, K, V, O, L, stride_qb, stride_qn, stride_kb, stride_kn, n_queries, n_keys, qk_scale,
                     IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr):
    """O and L for query rows [pid·BLOCK_Q, +BLOCK_Q) of batch·head `program_id(1)`."""
    q_start = tl.program_id(0) * BLOCK_Q
    bh = tl.program_id(1)
    offs_q = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = offs_q[:, None] < n_queries
    q = tl.load(Q + bh * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :], mask=q_rows, other=0.0)
    k_base = K + bh * stride_kb
    v_base = V + bh * stride_kb
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], dtype=tl.float32)
    if IS_CAUSAL:
        # key tiles ending at or before this block's first query are visible to all its rows
        full_end = tl.minimum(((q_start + 1) // BLOCK_K) * BLOCK_K, n_keys)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, offs_q, offs_d, 0, full_end,
                                   n_keys, qk_scale, False, EVEN_K, BLOCK_K, PRECISION)
        diagonal_end = tl.minimum(q_start + BLOCK_Q, n_keys)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, offs_q, offs_d, full_end,
                                   diagonal_end, n_keys, qk_scale, True, EVEN_K, BLOCK_K, PRECISION)
    else:
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, offs_q, offs_d, 0, n_keys,
                                   n_keys, qk_scale, False, EVEN_K, BLOCK_K, PRECISION)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) / LOG2E
    tl.store(L + bh * n_queries + offs_q, lse, mask=offs_q < n_queries)
    tl.store(O + bh * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=q_rows)


@triton.jit
def flash_bwd_delta_kernel(O, dO, Delta, stride_b, stride_n, n_queries, HEAD_DIM: tl.constexpr,
                           BLOCK_Q: tl.constexpr):
    """D = rowsum(dO ∘ O) in fp32 for one block of query rows."""
    offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    bh = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_q[:, None] < n_queries
    offsets = bh * stride_b + offs_q[:, None] * stride_n + offs_d[None, :]
    o = tl.load(O + offsets, mask=rows, other=0.0).to(tl.float32)
    do = tl.load(dO + offsets, mask=rows, other=0.0).to(tl.float32)
    tl.store(Delta + bh * n_queries + offs_q, tl.sum(o * do, 1), mask=offs_q < n_queries)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, offs_k, offs_d, lo, hi, n_queries,
                qk_scale, CAUSAL_MASK: tl.constexpr, BLOCK_Q: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query tiles [lo, hi) (transposed: keys are rows)."""
    for start_q in range(lo, hi, BLOCK_Q):
        offs_q = start_q + tl.arange(0, BLOCK_Q)
        rows = offs_q < n_queries
        # rows past Nq load as zeros: their dO and D are 0, so they add nothing to dV or dK
        q_t = tl.load(q_base + offs_q[None, :] * stride_qn + offs_d[:, None], mask=rows[None, :], other=0.0)
        do = tl.load(do_base + offs_q[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None], other=0.0)
        lse2 = tl.load(l_base + offs_q, mask=rows, other=0.0) * LOG2E
        delta = tl.load(delta_base + offs_q, mask=rows, other=0.0)
        p_t = tl.math.exp2(tl.dot(k, q_t, input_precision=PRECISION) * qk_scale - lse2[None, :])
        if CAUSAL_MASK:
            p_t = tl.where(offs_k[:, None] <= offs_q[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(Q, K, V, dO, L, Delta, dK, dV, stride_qb, stride_qn, stride_kb, stride_kn,
                          n_queries, n_keys, qk_scale, sm_scale, IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """dK and dV for keys [pid·BLOCK_K, +BLOCK_K): one pass over the query tiles that see them."""
    k_start = tl.program_id(0) * BLOCK_K
    bh = tl.program_id(1)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, HEAD_DIM)
    key_rows = offs_k[:, None] < n_keys
    kv_offsets = bh * stride_kb + offs_k[:, None] * stride_kn + offs_d[None, :]
    k = tl.load(K + kv_offsets, mask=key_rows, other=0.0)
    v = tl.load(V + kv_offsets, mask=key_rows, other=0.0)
    dk = tl.zeros([BLOCK_K, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_K, HEAD_DIM], dtype=tl.float32)
    q_base = Q + bh * stride_qb
    do_base = dO + bh * stride_qb
    l_base = L + bh * n_queries
    delta_base = Delta + bh * n_queries
    if IS_CAUSAL:
        # query tiles before k_start never see these keys; tiles from the first one starting at or after
        # the block's last key see all of them
        lo = (k_start // BLOCK_Q) * BLOCK_Q
        mid = tl.minimum(tl.cdiv(k_start + BLOCK_K - 1, BLOCK_Q) * BLOCK_Q, n_queries)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, offs_k, offs_d, lo, mid,
                             n_queries, qk_scale, True, BLOCK_Q, PRECISION)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, offs_k, offs_d, mid,
                             n_queries, n_queries, qk_scale, False, BLOCK_Q, PRECISION)
    else:
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, offs_k, offs_d, 0,
                             n_queries, n_queries, qk_scale, False, BLOCK_Q, PRECISION)
    tl.store(dK + kv_offsets, (dk * sm_scale).to(dK.dtype.element_ty), mask=key_rows)
    tl.store(dV + kv_offsets, dv.to(dV.dtype.element_ty), mask=key_rows)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, offs_q, offs_d, lo, hi, n_keys, qk_scale,
              CAUSAL_MASK: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key tiles [lo, hi)."""
    for start_k in range(lo, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        keys = offs_k[None, :] < n_keys
        k_t = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None], mask=keys, other=0.0)
        v_t = tl.load(v_base + offs_k[None, :] * stride_kn + offs_d[:, None], mask=keys, other=0.0)
        p = tl.math.exp2(tl.dot(q, k_t, input_precision=PRECISION) * qk_scale - lse2[:, None])
        if not EVEN_K:  # a zero key past Nk has score 0, and exp2(0 - L) may overflow: mask it
            p = tl.where(keys, p, 0.0)
        if CAUSAL_MASK:
            p = tl.where(offs_k[None, :] <= offs_q[:, None], p, 0.0)
        dp = tl.dot(do, v_t, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=PRECISION)
    return dq


@triton.jit
def flash_bwd_dq_kernel(Q, K, V, dO, L, Delta, dQ, stride_qb, stride_qn, stride_kb, stride_kn, n_queries, n_keys,
                        qk_scale, sm_scale, IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    """dQ for query rows [pid·BLOCK_Q, +BLOCK_Q): a second pass over key tiles (no atomics needed)."""
    q_start = tl.program_id(0) * BLOCK_Q
    bh = tl.program_id(1)
    offs_q = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_q < n_queries
    q_offsets = bh * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(Q + q_offsets, mask=rows[:, None], other=0.0)
    do = tl.load(dO + q_offsets, mask=rows[:, None], other=0.0)
    lse2 = tl.load(L + bh * n_queries + offs_q, mask=rows, other=0.0) * LOG2E
    delta = tl.load(Delta + bh * n_queries + offs_q, mask=rows, other=0.0)
    dq = tl.zeros([BLOCK_Q, HEAD_DIM], dtype=tl.float32)
    k_base = K + bh * stride_kb
    v_base = V + bh * stride_kb
    if IS_CAUSAL:
        full_end = tl.minimum(((q_start + 1) // BLOCK_K) * BLOCK_K, n_keys)
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, offs_q, offs_d, 0, full_end, n_keys,
                       qk_scale, False, EVEN_K, BLOCK_K, PRECISION)
        diagonal_end = tl.minimum(q_start + BLOCK_Q, n_keys)
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, offs_q, offs_d, full_end, diagonal_end,
                       n_keys, qk_scale, True, EVEN_K, BLOCK_K, PRECISION)
    else:
        dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, offs_q, offs_d, 0, n_keys, n_keys,
                       qk_scale, False, EVEN_K, BLOCK_K, PRECISION)
    tl.store(dQ + q_offsets, (dq * sm_scale).to(dQ.dtype.element_ty), mask=rows[:, None])
