"""The Mixture-of-Experts block of `TransformerLM`: router, routed experts, shared experts and the auxiliary
load-balancing loss. Routing (shared by both implementations, so they drop exactly the same assignments) lives
in `moe_routing`, the grouped fast path's pieces in `moe_dispatch` and its GEMMs in `moe_gemm`.

Implementations of the routed experts (`MOE_IMPLS`), tested against each other and against an independent
per-token reference written from the papers' equations (tests/nn):
- `grouped` (default): the fast path (`moe_dispatch`): the tokens permuted once into the expert buffer, each
  expert matrix as one GEMM over all experts (`torch._grouped_mm` on sm_90 in bf16, a padded `bmm` elsewhere:
  `moe_gemm`), the rows put back and summed per token in one kernel, the combine weights applied to the
  activation; nothing sorted twice, no Python loop over experts, no host sync with `torch._grouped_mm` (one
  per layer, the padding, with `bmm`);
- `reference`: a Python loop over the experts, each taking its tokens with a boolean mask: the oracle, slow.
Each piece runs inside a `stepscope.moe.<piece>` profiler range (router, dispatch, experts, combine, shared),
which `stepscope profile` reads as its `moe` category. `TransformerLM.aux_loss` sums the blocks' load-balancing
losses of the last forward; the training step adds it times `AUX_LOSS_COEF`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stepscope.errors import UsageError
from stepscope.nn.moe_dispatch import (
    MOE_RANGE_PREFIX,
    Dispatch,
    combine,
    compute_dtype,
    expert_mlp_grouped,
    moe_range,
    permute,
)
from stepscope.nn.moe_gemm import Layout, gemm_kind
from stepscope.nn.moe_routing import Router, Routing, expert_capacity
from stepscope.spec import ModelSpec

__all__ = ["AUX_LOSS_COEF", "MOE_IMPLS", "MOE_RANGE_PREFIX", "MoE", "RoutedExperts", "Router", "Routing",
           "check_impl", "expert_capacity", "expert_mlp", "moe_range"]

MOE_IMPLS: tuple[str, ...] = ("grouped", "reference")
"""Expert implementations, the default first."""
AUX_LOSS_COEF = 0.01
"""Weight of the load-balancing loss in the training loss (Switch Transformer's alpha = 1e-2)."""
def expert_mlp(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, b_up: torch.Tensor | None,
               b_down: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """One expert of the reference loop (x: (n, d), weights (d, f'), (f, d)): SwiGLU or GELU, like
    `transformer.MLP`."""
    h = torch.matmul(x, w_up)
    if b_up is not None:
        h = h + b_up.unsqueeze(-2)
    if gated:
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
    else:
        h = F.gelu(h, approximate="tanh")
    y = torch.matmul(h, w_down)
    return y + b_down.unsqueeze(-2) if b_down is not None else y


class RoutedExperts(nn.Module):
    """The n_experts routed experts, their weights stacked: w_up (E, d, f or 2f), w_down (E, f, d)."""

    def __init__(self, spec: ModelSpec, impl: str) -> None:
        super().__init__()
        e, d, f = spec.n_experts, spec.d_model, spec.expert_d_ff
        self.gated, self.impl = spec.mlp == "swiglu", impl
        up = (2 if self.gated else 1) * f
        self.w_up = nn.Parameter(torch.empty(e, d, up))
        self.w_down = nn.Parameter(torch.empty(e, f, d))
        self.b_up = nn.Parameter(torch.zeros(e, up)) if spec.mlp_bias else None
        self.b_down = nn.Parameter(torch.zeros(e, d)) if spec.mlp_bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        nn.init.normal_(self.w_up, std=std)
        nn.init.normal_(self.w_down, std=std)
        for bias in (self.b_up, self.b_down):
            if bias is not None:
                nn.init.zeros_(bias)

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """x: (T, d) -> the weighted sum of each token's kept experts, (T, d)."""
        if self.impl == "reference":
            return self._reference(x, routing)
        return self._grouped(x, routing)

    def _expert(self, index: int | slice) -> tuple[torch.Tensor, ...]:
        biases = [b[index] if b is not None else None for b in (self.b_up, self.b_down)]
        return self.w_up[index], self.w_down[index], *biases

    def _reference(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        out: torch.Tensor | None = None  # in the experts' output dtype (bf16 under autocast), made on first use
        for expert in range(self.w_up.shape[0]):
            with moe_range("dispatch"):
                token, choice = ((routing.experts == expert) & routing.keep).nonzero(as_tuple=True)
                if token.numel() == 0:
                    continue
                rows = x[token]
            with moe_range("experts"):
                y = expert_mlp(rows, *self._expert(expert), self.gated)
            with moe_range("combine"):
                out = y.new_zeros(x.shape) if out is None else out
                out = out.index_add(0, token, y * routing.weights[token, choice].unsqueeze(1).to(y.dtype))
        return out if out is not None else torch.zeros_like(x)

    def _grouped(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        with moe_range("dispatch"):
            dtype = compute_dtype(x)
            dispatch = Dispatch.of(routing, gemm_kind(x.device, dtype, (self.w_up.shape[1], self.w_up.shape[2],
                                                                          self.w_down.shape[1])))
            rows = permute(x.to(dtype), dispatch)
            row_weights = dispatch.row_weights(routing)
        with moe_range("experts"):
            y = self.grouped_rows(rows, row_weights, dispatch.layout)
        with moe_range("combine"):
            return combine(y, dispatch)

    def grouped_rows(self, rows: torch.Tensor, row_weights: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        """Every expert on its rows of the buffer (`layout`), each output row times its weight."""
        # the parameters themselves, not a slice of them: a slice's backward zero-fills a full-size gradient
        params = (self.w_up, self.w_down, self.b_up, self.b_down)
        weights = [p.to(rows.dtype) if p is not None else None for p in params]
        return expert_mlp_grouped(rows, row_weights, layout, *weights, self.gated)


class MoE(nn.Module):
    """Router, routed experts, shared experts: (batch, seq, d) -> (batch, seq, d); `aux_loss` after forward."""

    def __init__(self, spec: ModelSpec, impl: str = MOE_IMPLS[0], shared: type[nn.Module] | None = None) -> None:
        super().__init__()
        check_impl(impl)
        self.router = Router(spec)
        self.experts = RoutedExperts(spec, impl)
        # shared experts are plain MLPs of width expert_d_ff (`shared` is transformer.MLP, passed to avoid a cycle)
        self.shared = nn.ModuleList(shared(spec, spec.expert_d_ff) for _ in range(spec.n_shared_experts)) \
            if shared is not None else nn.ModuleList()
        self.aux_loss: torch.Tensor | None = None

    @property
    def impl(self) -> str:
        return self.experts.impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        with moe_range("router"):
            routing = self.router(flat)
        self.aux_loss = routing.aux_loss
        out = self.experts(flat, routing)
        if len(self.shared):
            with moe_range("shared"):
                for expert in self.shared:
                    out = out + expert(flat)
        return out.view_as(x)


def check_impl(impl: str) -> None:
    if impl not in MOE_IMPLS:
        raise UsageError(f"unknown MoE implementation {impl!r}; known: {', '.join(MOE_IMPLS)}")
