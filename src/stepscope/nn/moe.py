"""The Mixture-of-Experts block of `TransformerLM`: router, top-k dispatch, routed experts, combine, shared
experts and the auxiliary load-balancing loss.

Read top to bottom: routing (shared by both implementations, so they drop exactly the same tokens), the two
expert implementations, the block.

- Router `softmax` (Mixtral, Qwen3): softmax over the experts, top-k, the k weights renormalised to sum to 1.
  Router `sigmoid` (DeepSeek-V3): sigmoid scores; a bias buffer (not trained, moved by `balance_bias`) is
  added to the scores only to choose the top-k; the weights are the chosen scores, renormalised.
  Group-limited routing (`expert_groups`, DeepSeek-V3's node-limited routing): the experts form equal
  groups, a group scores the sum of its two best selection scores, and a token picks its top-k among the
  experts of its best `groups_per_token` groups.
- Capacity: with `capacity_factor` cf > 0 an expert takes at most ceil(cf x tokens x k / n_experts)
  assignments, first come first served in token order; the others are dropped (their routed output is 0,
  the residual and the shared experts still carry the token). cf = 0 is dropless.
- Auxiliary loss (Switch Transformer / GShard): n_experts x sum_i f_i x P_i, with f_i the fraction of the
  tokens x k assignments that chose expert i (before dropping) and P_i the mean router probability of
  expert i (for the sigmoid router, the scores normalised per token). It is 1 when the load is uniform.
  `TransformerLM.aux_loss` sums it over the MoE blocks of the last forward; the training step adds it
  times `AUX_LOSS_COEF`.

Implementations (`MOE_IMPLS`), tested against each other:
- `reference`: a Python loop over the experts, each taking its tokens with a boolean mask;
- `grouped`: the kept assignments scattered into a padded (n_experts, capacity, d_model) buffer at their
  slot (the rank of the assignment within its expert), one batched matmul per expert matrix for all
  experts, and the rows gathered back. Padding rows are computed and ignored: with dropless routing the
  buffer is as tall as the busiest expert. `torch._grouped_mm` (sorted rows, no padding) exists in torch
  2.13's CPU build, but on this CPU it was 1.4x slower than the padded bmm at tiny-moe's shapes and no faster
  at larger ones, and it needs contiguous gradients and its operands cast by hand (docs/moe.md).
Each piece runs inside a `stepscope.moe.<piece>` profiler range (router, dispatch, experts, combine, shared),
which `stepscope profile` reads as its `moe` category.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stepscope.errors import UsageError
from stepscope.spec import ModelSpec

MOE_IMPLS: tuple[str, ...] = ("grouped", "reference")
"""Expert implementations, the default first."""
AUX_LOSS_COEF = 0.01
"""Weight of the load-balancing loss in the training loss (Switch Transformer's alpha = 1e-2)."""
MOE_RANGE_PREFIX = "stepscope.moe."
"""Profiler ranges around the MoE pieces: stepscope.moe.router, .dispatch, .experts, .combine, .shared."""


def moe_range(piece: str) -> torch.profiler.record_function:
    return torch.profiler.record_function(MOE_RANGE_PREFIX + piece)


@dataclass
class Routing:
    """Where each of T tokens goes: k experts, their weights, and which assignments fit in capacity."""

    experts: torch.Tensor
    """(T, k) expert ids."""
    weights: torch.Tensor
    """(T, k) combine weights (fp32, differentiable)."""
    slot: torch.Tensor
    """(T, k) rank of the assignment among its expert's assignments, in token order."""
    keep: torch.Tensor
    """(T, k) bool: the assignment fits in its expert's capacity (all True when dropless)."""
    capacity: int
    """Rows per expert in the grouped buffer: the busiest expert's assignments, at most the capacity."""
    aux_loss: torch.Tensor
    """The load-balancing loss of these tokens (scalar)."""


def expert_capacity(tokens: int, k: int, n_experts: int, capacity_factor: float) -> int | None:
    """ceil(cf x tokens x k / n_experts), None when dropless (cf = 0)."""
    return math.ceil(capacity_factor * tokens * k / n_experts) if capacity_factor > 0 else None


class Router(nn.Module):
    """Scores tokens against experts (a d_model x n_experts linear layer) and picks the top k."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.n_experts, self.k, self.kind = spec.n_experts, spec.experts_per_token, spec.router
        self.capacity_factor = spec.capacity_factor
        self.groups, self.groups_per_token = spec.expert_groups, spec.groups_per_token
        self.gate = nn.Linear(spec.d_model, spec.n_experts, bias=False)
        if self.kind == "sigmoid":
            # DeepSeek-V3's auxiliary-loss-free balancing bias: moves selection only, never trained
            self.register_buffer("bias", torch.zeros(spec.n_experts))

    def forward(self, x: torch.Tensor) -> Routing:
        """x: (T, d_model)."""
        logits = self.gate(x).float()
        if self.kind == "softmax":
            probs = logits.softmax(dim=-1)
            experts = self.limit_groups(probs).topk(self.k, dim=-1).indices
            weights = probs.gather(1, experts)
        else:
            scores = logits.sigmoid()
            experts = self.limit_groups(scores + self.bias).topk(self.k, dim=-1).indices
            weights = scores.gather(1, experts)
            probs = scores / scores.sum(dim=-1, keepdim=True)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        onehot = F.one_hot(experts.reshape(-1), self.n_experts)  # (T*k, E), token-major: first come first served
        counts = onehot.sum(dim=0)
        slot = (onehot.cumsum(dim=0).gather(1, experts.reshape(-1, 1)) - 1).view_as(experts)
        capacity = expert_capacity(x.shape[0], self.k, self.n_experts, self.capacity_factor)
        keep = slot < capacity if capacity is not None else torch.ones_like(experts, dtype=torch.bool)
        # rows of the grouped buffer: no expert keeps more than its count or the capacity
        rows = int(counts.max()) if capacity is None else min(capacity, int(counts.max()))
        fraction = counts.float() / experts.numel()
        aux_loss = self.n_experts * (fraction * probs.mean(dim=0)).sum()
        return Routing(experts, weights, slot, keep, rows, aux_loss)

    def limit_groups(self, selection: torch.Tensor) -> torch.Tensor:
        """Selection scores (T, E) with the experts outside each token's best groups set to -inf (unchanged
        without group-limited routing)."""
        if not self.groups:
            return selection
        grouped = selection.view(selection.shape[0], self.groups, -1)
        group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
        chosen = group_score.topk(self.groups_per_token, dim=-1).indices
        allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, chosen, True)
        return grouped.masked_fill(~allowed.unsqueeze(-1), float("-inf")).view_as(selection)

    @torch.no_grad()
    def balance_bias(self, counts: torch.Tensor, rate: float = 1e-3) -> None:
        """DeepSeek-V3's update: raise the bias of under-loaded experts, lower it for over-loaded ones."""
        if self.kind == "sigmoid":
            self.bias += rate * torch.sign(counts.float().mean() - counts.float())


def expert_mlp(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, b_up: torch.Tensor | None,
               b_down: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """One expert (x: (n, d), weights (d, f'), (f, d)) or all of them at once (x: (E, n, d), weights (E, ...)):
    SwiGLU or GELU, like `transformer.MLP`."""
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
        n_experts, rows = self.w_up.shape[0], routing.capacity
        with moe_range("dispatch"):
            kept = routing.keep.reshape(-1).nonzero().squeeze(1)  # kept assignments, token-major
            token = kept // routing.experts.shape[1]
            place = routing.experts.reshape(-1)[kept] * rows + routing.slot.reshape(-1)[kept]
            buffer = x.new_zeros(n_experts * rows, x.shape[1]).index_copy(0, place, x[token])
        with moe_range("experts"):
            y = expert_mlp(buffer.view(n_experts, rows, -1), *self._expert(slice(None)), self.gated)
        with moe_range("combine"):
            picked = y.reshape(n_experts * rows, -1).index_select(0, place)
            weights = routing.weights.reshape(-1)[kept].unsqueeze(1).to(picked.dtype)
            return picked.new_zeros(x.shape).index_add(0, token, picked * weights)


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
