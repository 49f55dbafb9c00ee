"""Causal self-attention backends, selected by name.

A backend is a function `(q, k, v, is_causal) -> out` on tensors shaped (batch, heads, seq, head_dim)
with the same number of heads in q, k and v (the model repeats grouped KV heads before calling).
The causal mask is aligned top-left (query i sees keys 0..i), like `F.scaled_dot_product_attention`.
Other modules add backends with `register_attention` (the flash kernels do).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from stepscope.errors import UsageError

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

_BACKENDS: dict[str, AttentionFn] = {}
# Backends whose module is imported on first use, so `import stepscope.nn` stays light.
_LAZY_BACKENDS: dict[str, str] = {}


def register_attention(name: str) -> Callable[[AttentionFn], AttentionFn]:
    """Decorator: make `fn` available as attention backend `name`."""

    def add(fn: AttentionFn) -> AttentionFn:
        _BACKENDS[name] = fn
        return fn

    return add


def register_lazy_attention(name: str, module: str) -> None:
    """Declare that importing `module` registers backend `name`."""
    _LAZY_BACKENDS[name] = module


def attention_backends() -> list[str]:
    """Every backend name, registered or loadable on first use."""
    return sorted(set(_BACKENDS) | set(_LAZY_BACKENDS))


def get_attention(name: str) -> AttentionFn:
    """The backend `name` (importing its module first if it is lazy); UsageError for an unknown name."""
    if name not in _BACKENDS and name in _LAZY_BACKENDS:
        import importlib

        importlib.import_module(_LAZY_BACKENDS[name])
    if name not in _BACKENDS:
        raise UsageError(f"unknown attention backend {name!r}; known: {', '.join(attention_backends())}")
    return _BACKENDS[name]


def causal_mask(n_queries: int, n_keys: int, device: torch.device) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where a query may look (top-left aligned tril)."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


@register_attention("naive")
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """Textbook attention with every step a separate op (so a profiler can see each one).

    Keeps the (seq x seq) scores and probabilities alive for backward: quadratic memory.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


@register_attention("sdpa")
def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """PyTorch's fused kernels (flash / memory-efficient / math, chosen by PyTorch)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


# FlashAttention-2 implementations live in stepscope.kernels; importing them registers the backends.
register_lazy_attention("flash-torch", "stepscope.kernels.flash_torch")
register_lazy_attention("flash-triton", "stepscope.kernels.flash_triton")
