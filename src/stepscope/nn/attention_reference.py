"""What every attention kernel is checked and counted against: the fp64 reference and the FLOP convention.

- `reference_attention`: textbook softmax(s·QKᵀ + mask) V computed in fp64, with autograd (tests).
- `reference_forward_backward`: the same maths by blocks of query rows, in fp64, returning the output,
  the logsumexp and the gradients for a given dO without ever holding an Nq×Nk matrix for all rows:
  the yardstick of the benchmark's correctness check at sequence lengths where naive fp64 would not fit.
- `attention_flops`: the FlashAttention FLOP convention (two matmuls forward, backward = 2.5× forward,
  causal = half), used for every TFLOP/s figure.
- `relative_error`: max |x − ref| / max |ref|, the one error measure tests and the benchmark compare.

The causal mask is aligned top-left (query i sees keys 0..i), like `F.scaled_dot_product_attention`.
Masked scores are −1e6, not −inf, as in the kernels, so a row with no visible key cannot give NaN.
"""

from __future__ import annotations

import math

import torch

MASKED_SCORE = -1.0e6
"""The score given to masked (query, key) pairs: exp(−1e6 − m) is 0, and never NaN like −inf − (−inf)."""

PASSES = ("fwd", "bwd", "fwd-bwd")
"""What a benchmark can time: the forward, the backward (after an untimed forward), or both."""

# backward has 5 matmuls of the forward's size where the forward has 2: 2.5x the forward's FLOPs
_PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd-bwd": 3.5}


def attention_flops(batch_heads: int, n_queries: int, n_keys: int, head_dim: int, causal: bool,
                    pass_: str = "fwd") -> float:
    """FLOPs of `pass_` by the FlashAttention convention: forward = 4·BH·Nq·Nk·d, ×0.5 when causal."""
    forward = 4.0 * batch_heads * n_queries * n_keys * head_dim * (0.5 if causal else 1.0)
    return forward * _PASS_FACTOR[pass_]


def causal_visible(n_queries: int, n_keys: int, device: torch.device | str = "cpu",
                   query_offset: int = 0) -> torch.Tensor:
    """Boolean (n_queries, n_keys): True where query `query_offset + i` may see key j (j <= query)."""
    rows = torch.arange(query_offset, query_offset + n_queries, device=device).unsqueeze(-1)
    return torch.arange(n_keys, device=device) <= rows


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(QKᵀ/√d + mask) V in fp64 (differentiable); inputs (..., N, d) of any float dtype."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_visible(q.shape[-2], k.shape[-2], q.device), MASKED_SCORE)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def reference_forward_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor | None,
                               is_causal: bool, *, rows: torch.Tensor | None = None, block: int = 256
                               ) -> dict[str, torch.Tensor]:
    """Output, logsumexp and (with `grad_out`) gradients in fp64, one block of query rows at a time.

    `rows` restricts the computation to those query rows (1-D index tensor): `out` and `lse` then hold
    only those rows, and the gradients are exact for a `grad_out` that is zero outside those rows
    (the benchmark's cheap check at long sequences). Each row's softmax spans all its keys at once,
    so nothing here is an online softmax: it is the textbook formula, blocked only to bound memory.
    """
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1])
    n_queries = q.shape[-2]
    rows = torch.arange(n_queries, device=q.device) if rows is None else rows.to(q.device)
    outs, lses = [], []
    grads = None
    if grad_out is not None:
        grad_out = grad_out.double()
        grads = {"dq": torch.zeros_like(q), "dk": torch.zeros_like(k), "dv": torch.zeros_like(v)}
    for start in range(0, rows.numel(), block):
        index = rows[start:start + block]
        q_rows = q.index_select(-2, index)
        scores = torch.matmul(q_rows, k.transpose(-2, -1)) * scale
        if is_causal:
            visible = torch.arange(k.shape[-2], device=q.device) <= index.unsqueeze(-1)
            scores = scores.masked_fill(~visible, MASKED_SCORE)
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse.unsqueeze(-1))
        out = torch.matmul(probs, v)
        outs.append(out)
        lses.append(lse)
        if grads is not None:
            d_out = grad_out.index_select(-2, index)
            grads["dv"] += torch.matmul(probs.transpose(-2, -1), d_out)
            d_probs = torch.matmul(d_out, v.transpose(-2, -1))
            d_scores = probs * (d_probs - (d_out * out).sum(-1, keepdim=True))
            grads["dq"].index_add_(-2, index, torch.matmul(d_scores, k) * scale)
            grads["dk"] += torch.matmul(d_scores.transpose(-2, -1), q_rows) * scale
    result = {"out": torch.cat(outs, dim=-2), "lse": torch.cat(lses, dim=-1)}
    if grads is not None:
        result.update(grads)
    return result


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value − reference| / max |reference| (in fp64); 0 when both are all zeros."""
    reference = reference.double()
    error = (value.double() - reference).abs().max().item()
    scale = reference.abs().max().item()
    return error / scale if scale > 0 else error
