"""The attention implementations `stepscope attention` compares, by name, and where each can run.

- naive: `stepscope.nn.attention.naive_attention`, every step a separate op (N×N scores kept);
- sdpa: `F.scaled_dot_product_attention` (PyTorch picks its fused kernel: flash on CPU and GPU);
- compiled: `torch.compile` of the naive function (compiled anew per shape; the first call's time,
  compilation included, is reported as `first_call_s`);
- flash-torch: `stepscope.kernels.FlashAttentionTorch` (tiled PyTorch, any device);
- flash-triton: `stepscope.kernels.FlashAttentionTriton` (GPU, or Triton's interpreter on a CPU).
Each is called as fn(q, k, v, is_causal) on (batch, heads, seq, dim) tensors.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

IMPLS = ("naive", "sdpa", "compiled", "flash-torch", "flash-triton")


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def attention_impl(name: str) -> AttentionFn:
    """A fresh callable for implementation `name` (for `compiled`: a new, not yet compiled, wrapper)."""
    if name == "naive":
        from stepscope.nn.attention import naive_attention

        return naive_attention
    if name == "sdpa":
        return _sdpa
    if name == "compiled":
        import torch._dynamo

        from stepscope.nn.attention import naive_attention

        # one shape per compilation: a long sweep would otherwise hit dynamo's recompile limit
        torch._dynamo.reset()
        return torch.compile(naive_attention, dynamic=False)
    if name == "flash-torch":
        from stepscope.kernels.flash_torch import FlashAttentionTorch

        return FlashAttentionTorch.apply
    if name == "flash-triton":
        from stepscope.kernels.flash_triton import FlashAttentionTriton

        return FlashAttentionTriton.apply
    raise ValueError(f"unknown attention implementation {name!r}; known: {', '.join(IMPLS)}")


def unsupported_reason(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why `name` cannot run attention of this dtype and head_dim on `device` here, or None (the attention
    benchmark makes it an `unsupported` row; `stepscope step` refuses the workload up front)."""
    if name == "flash-triton":
        from stepscope.kernels.flash_triton import HEAD_DIMS, unavailable_reason

        reason = unavailable_reason(device, dtype)
        if reason is None and head_dim not in HEAD_DIMS:
            reason = f"flash-triton supports head_dim {HEAD_DIMS}, got {head_dim}"
        return reason
    return None


def usage_problem(name: str, device: torch.device) -> str | None:
    """A reason to refuse the whole command up front (bad choice for this machine), or None."""
    if name not in IMPLS:
        return f"unknown implementation {name!r}; choose from {', '.join(IMPLS)}"
    if name == "flash-triton":
        from stepscope.kernels.flash_triton import unavailable_reason

        return unavailable_reason(device)
    return None
