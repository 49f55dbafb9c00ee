"""Routing of the Mixture-of-Experts block: which k experts each token goes to, with which weights, which of
those assignments fit in their expert's capacity, and the one sort of the assignments by expert that every
implementation (the grouped fast path, the expert-parallel dispatcher) reads.

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

Everything stays on the device: the per-expert counts are a tensor (a scatter-add, not `bincount`, so the
shape is static under torch.compile), the capacity is a Python int from the shapes alone, and the rank of an
assignment among its expert's (which decides what is dropped) comes from the same stable sort that orders
the rows for the expert GEMMs. No host synchronisation happens here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stepscope.spec import ModelSpec


@dataclass
class Routing:
    """Where each of T tokens goes: k experts, their weights, which assignments fit in capacity, and the
    assignments sorted by expert."""

    experts: torch.Tensor
    """(T, k) expert ids."""
    weights: torch.Tensor
    """(T, k) combine weights (fp32, differentiable; a dropped assignment keeps its weight here, the experts
    give it none)."""
    keep: torch.Tensor
    """(T, k) bool: the assignment fits in its expert's capacity (all True when dropless)."""
    rank: torch.Tensor
    """(T, k) the assignment's position among its expert's, in token order (kept: rank < capacity)."""
    order: torch.Tensor
    """(T*k,) the flat (token-major) assignment indices sorted by expert, token order within an expert: the one
    sort every dispatcher reads."""
    counts: torch.Tensor
    """(n_experts,) assignments per expert before dropping (int64, on the device)."""
    capacity: int | None
    """Assignments an expert keeps at most (None: dropless)."""
    aux_loss: torch.Tensor
    """The load-balancing loss of these tokens (scalar)."""

    @property
    def kept_counts(self) -> torch.Tensor:
        """(n_experts,) assignments per expert after dropping (on the device)."""
        return self.counts if self.capacity is None else self.counts.clamp(max=self.capacity)

    def kept_weights(self) -> torch.Tensor:
        """(T, k) the combine weights with the dropped assignments' set to 0 (differentiable)."""
        return self.weights if self.capacity is None else self.weights.masked_fill(~self.keep, 0.0)


def expert_capacity(tokens: int, k: int, n_experts: int, capacity_factor: float) -> int | None:
    """ceil(cf x tokens x k / n_experts), None when dropless (cf = 0)."""
    return math.ceil(capacity_factor * tokens * k / n_experts) if capacity_factor > 0 else None


def sort_by_expert(experts: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, counts, rank) of the flat assignments `experts` (T, k): `order` sorts them by expert (stable, so
    token order within an expert), `counts` per expert, and `rank` (T, k) the position of each assignment among
    its expert's, in token order (first come first served)."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    starts = counts.cumsum(0) - counts
    position = torch.arange(flat.numel(), device=flat.device)
    rank = torch.empty_like(flat).scatter_(0, order, position - starts.index_select(0, flat.index_select(0, order)))
    return order, counts, rank.view_as(experts)


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
            weights = scores.gather(1, experts)  # the bias chose the experts; the weights are the bare scores
            probs = scores / scores.sum(dim=-1, keepdim=True)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        order, counts, rank = sort_by_expert(experts, self.n_experts)
        capacity = expert_capacity(x.shape[0], self.k, self.n_experts, self.capacity_factor)
        keep = rank < capacity if capacity is not None else torch.ones_like(experts, dtype=torch.bool)
        fraction = counts.float() / experts.numel()
        aux_loss = self.n_experts * (fraction * probs.mean(dim=0)).sum()
        return Routing(experts, weights, keep, rank, order, counts, capacity, aux_loss)

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
