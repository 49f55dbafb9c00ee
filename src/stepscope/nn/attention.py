"""The one registry of causal self-attention backends: what `TransformerLM(spec, attention=...)`, `stepscope
step --attention` and `stepscope attention --impl` choose from, and where each can run.

A backend is a function `(q, k, v, is_causal) -> out` on tensors shaped (batch, heads, seq, head_dim)
with the same number of heads in q, k and v (the model repeats grouped KV heads before calling).
The causal mask is aligned top-left (query i sees keys 0..i), like `F.scaled_dot_product_attention`.

| name | what it is |
|---|---|
| naive | every step a separate op (the N×N scores and probabilities kept for backward) |
| sdpa | `F.scaled_dot_product_attention` (PyTorch picks its fused kernel) |
| compiled | `torch.compile` of the naive function (compiled per shape on its first call) |
| flash-torch | FlashAttention-2 tiled in PyTorch (`stepscope.kernels.flash_torch`), any device |
| flash-triton | FlashAttention-2 in Triton (`stepscope.kernels.flash_triton`): a GPU, or Triton's interpreter |

The kernels register themselves (`register_attention`) when their module is imported, which happens on
first use of their name, so `import stepscope.nn` stays light.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stepscope.errors import UsageError

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
Unsupported = Callable[[torch.device, "torch.dtype | None", "int | None"], "str | None"]


def _runs_everywhere(device: torch.device, dtype: torch.dtype | None, head_dim: int | None) -> str | None:
    return None


@dataclass(frozen=True)
class AttentionBackend:
    """A registered backend."""

    name: str
    make: Callable[[], AttentionFn]
    """A callable ready to use (for `compiled`, a new wrapper that compiles on its first call)."""
    unsupported: Unsupported = _runs_everywhere
    """Why it cannot run on a device with this dtype and head_dim (None: it can; None arguments: any)."""


_BACKENDS: dict[str, AttentionBackend] = {}
_LAZY_MODULES = {"flash-torch": "stepscope.kernels.flash_torch", "flash-triton": "stepscope.kernels.flash_triton"}
"""Backends whose module registers them when imported, on first use of the name."""


def register_attention(name: str, *, unsupported: Unsupported | None = None) -> Callable[[AttentionFn], AttentionFn]:
    """Decorator: make `fn` available as attention backend `name` (`unsupported` says where it cannot run)."""

    def add(fn: AttentionFn) -> AttentionFn:
        _BACKENDS[name] = AttentionBackend(name, lambda: fn, unsupported or _runs_everywhere)
        return fn

    return add


def attention_backends() -> list[str]:
    """Every backend name, registered or loadable on first use, in the order of the table above."""
    return [*_BACKENDS, *(name for name in _LAZY_MODULES if name not in _BACKENDS)]


def attention_backend(name: str) -> AttentionBackend:
    """The backend `name` (importing its module first if it is lazy); UsageError for an unknown name."""
    if name not in _BACKENDS and name in _LAZY_MODULES:
        importlib.import_module(_LAZY_MODULES[name])
    if name not in _BACKENDS:
        raise UsageError(f"unknown attention backend {name!r}; known: {', '.join(attention_backends())}")
    return _BACKENDS[name]


def get_attention(name: str) -> AttentionFn:
    """The attention function of backend `name` (UsageError for an unknown name)."""
    return attention_backend(name).make()


def unsupported_reason(name: str, device: torch.device | str, dtype: torch.dtype | None = None,
                       head_dim: int | None = None) -> str | None:
    """Why backend `name` cannot run on `device` (with this dtype and head_dim, when given) here, or None.
    `stepscope step` refuses such a workload up front; the attention benchmark makes it an `unsupported` row."""
    return attention_backend(name).unsupported(torch.device(device), dtype, head_dim)


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


def _compiled_naive() -> AttentionFn:
    # a fixed shape per compilation: dynamic shapes would hide the per-shape compile the benchmark reports
    return torch.compile(naive_attention, dynamic=False)


_BACKENDS["compiled"] = AttentionBackend("compiled", _compiled_naive)
