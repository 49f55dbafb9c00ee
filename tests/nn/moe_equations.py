"""An independent Mixture-of-Experts oracle, written from the papers' equations one token at a time in float64.
It shares no code with `stepscope.nn.moe*` (it reads only the parameter tensors), so a bug there cannot hide in
it. Equations:

- Softmax routing (Shazeer et al. 2017; Mixtral, Jiang et al. 2024, eq. 1-2; Qwen3 with norm_topk_prob): p =
  softmax(x W_g); the token goes to the k largest p_i, with weights p_i / sum of the chosen p_j ("renormalised";
  Mixtral's softmax over the top-k logits is the same thing). Switch Transformer (Fedus et al. 2022) keeps the
  raw p_i (`renormalise=False`); no stepscope preset routes that way.
- Sigmoid routing with a balancing bias (DeepSeek-V3, arXiv 2412.19437, eq. 15-16 and §2.1.2): s_i = sigmoid(x W_g
  column i); the top-k of s_i + b_i are chosen, and the weights are the chosen s_i (without b_i), normalised by
  their sum. The bias only selects.
- Group-limited routing (DeepSeek-V3 §2.1.2 / config n_group, topk_group): experts in G equal groups, a group's
  score the sum of its two best selection scores, the top-k taken among the experts of the best groups only.
- Capacity (GShard, Lepikhin et al. 2020; Switch §2.2): expert capacity ceil(cf x T x k / E); assignments are
  served in token order and an expert full at its capacity drops the rest (their contribution is 0).
- Output: y_t = sum over the kept (i, g) of token t of g x FFN_i(x_t) + sum of the shared experts' FFN(x_t);
  FFN is SwiGLU (silu(x W_gate) * (x W_up)) W_down (Shazeer 2020) or GELU(x W_1 + b_1) W_2 + b_2.
- Load-balancing loss (Switch eq. 4-6): E x sum_i f_i P_i, f_i the fraction of the T x k assignments that chose
  expert i, P_i the mean over tokens of the router probability (for the sigmoid router s normalised per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Choice:
    """One token's assignment: an expert, its combine weight, whether its expert had room."""

    expert: int
    weight: torch.Tensor
    kept: bool


def _silu(v: torch.Tensor) -> torch.Tensor:
    return v / (1 + torch.exp(-v))


def _gelu_tanh(v: torch.Tensor) -> torch.Tensor:
    return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def ffn(x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, b_up: torch.Tensor | None,
        b_down: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """One expert on one token x (d,): w_up (d, 2f) = [gate | up] when gated, else (d, f)."""
    h = x @ w_up
    if b_up is not None:
        h = h + b_up
    if gated:
        f = h.shape[0] // 2
        a = _silu(h[:f]) * h[f:]
    else:
        a = _gelu_tanh(h)
    y = a @ w_down
    return y + b_down if b_down is not None else y


def probabilities(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """Per token: softmax over the experts, or the sigmoid scores."""
    if kind == "softmax":
        e = torch.exp(logits - logits.max())
        return e / e.sum()
    return 1 / (1 + torch.exp(-logits))


def choose(selection: list[float], k: int, groups: int = 0, groups_per_token: int = 0) -> list[int]:
    """The k experts with the largest selection scores (within the best groups under group-limited routing)."""
    experts = list(range(len(selection)))
    if groups:
        size = len(selection) // groups
        score = [sum(sorted(selection[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(groups)]
        best = sorted(range(groups), key=lambda g: -score[g])[:groups_per_token]
        experts = [e for e in experts if e // size in best]
    return sorted(experts, key=lambda e: -selection[e])[:k]


def route(x: torch.Tensor, gate: torch.Tensor, kind: str, k: int, *, bias: torch.Tensor | None = None,
          capacity_factor: float = 0.0, groups: int = 0, groups_per_token: int = 0,
          renormalise: bool = True) -> tuple[list[list[Choice]], torch.Tensor]:
    """Per token its k choices, and the load-balancing loss. x (T, d), gate (E, d) as nn.Linear holds it."""
    tokens, n_experts = x.shape[0], gate.shape[0]
    capacity = math.ceil(capacity_factor * tokens * k / n_experts) if capacity_factor > 0 else None
    served = [0] * n_experts
    chosen_count = [0] * n_experts
    mean_prob = torch.zeros(n_experts, dtype=x.dtype)
    plan = []
    for t in range(tokens):
        p = probabilities(gate @ x[t], kind)
        selection = [float(p[i].detach()) + (float(bias[i]) if bias is not None else 0.0) for i in range(n_experts)]
        experts = choose(selection, k, groups, groups_per_token)
        total = sum(p[i] for i in experts)
        choices = []
        for i in experts:
            fits = capacity is None or served[i] < capacity
            served[i] += 1 if fits else 0
            chosen_count[i] += 1
            choices.append(Choice(i, p[i] / total if renormalise else p[i], fits))
        plan.append(choices)
        mean_prob = mean_prob + (p if kind == "softmax" else p / p.sum()) / tokens
    fraction = torch.tensor(chosen_count, dtype=x.dtype) / (tokens * k)
    return plan, n_experts * (fraction * mean_prob).sum()


@dataclass
class Weights:
    """The block's parameters in float64, read from an `nn.moe.MoE` (or built by hand)."""

    gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    b_up: torch.Tensor | None
    b_down: torch.Tensor | None
    shared: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]
    bias: torch.Tensor | None

    @classmethod
    def of(cls, block: torch.nn.Module) -> Weights:
        """float64 leaf copies of `block`'s tensors (their .grad is the oracle's gradient)."""
        def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().double().clone().requires_grad_()

        experts = block.experts
        shared = [(leaf(m.up.weight.t()), leaf(m.down.weight.t()), leaf(m.up.bias), leaf(m.down.bias))
                  for m in block.shared]
        bias = getattr(block.router, "bias", None)
        return cls(leaf(block.router.gate.weight), leaf(experts.w_up), leaf(experts.w_down), leaf(experts.b_up),
                   leaf(experts.b_down), shared, None if bias is None else bias.detach().double())


def moe(x: torch.Tensor, w: Weights, kind: str, k: int, gated: bool, **routing: float) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """The block's output (T, d) and its load-balancing loss, token by token."""
    plan, aux = route(x, w.gate, kind, k, bias=w.bias, **routing)
    rows = []
    for t, choices in enumerate(plan):
        y = torch.zeros(x.shape[1], dtype=x.dtype)
        for c in choices:
            if c.kept:
                i = c.expert
                y = y + c.weight * ffn(x[t], w.w_up[i], w.w_down[i], None if w.b_up is None else w.b_up[i],
                                       None if w.b_down is None else w.b_down[i], gated)
        for up, down, b_up, b_down in w.shared:
            y = y + ffn(x[t], up, down, b_up, b_down, gated)
        rows.append(y)
    return torch.stack(rows), aux
