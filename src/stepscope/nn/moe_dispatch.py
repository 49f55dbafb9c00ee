"""The grouped fast path of the routed experts, piece by piece: permute the tokens into rows sorted by expert,
run the experts as grouped GEMMs, put the rows back and sum them per token.

Every piece reads the one sort of the router (`Routing.order`) and computes no other:
- `Dispatch`: row r of the sorted buffer holds assignment order[r], i.e. token order[r] // k; `bags` (T, k)
  is the inverse, the row of each assignment. Every assignment has a row, dropped ones included (their
  weight is 0, so their row contributes exactly 0 and receives no gradient): the shapes are static (T x k rows,
  no host sync, nothing for torch.compile to specialise) and the experts compute tokens x k rows, the
  activated FLOPs the model counts. The expert-parallel dispatcher, which must not send dropped rows, packs
  the kept ones instead (`distributed.expert_parallel`).
- `permute` gathers the rows (`index_select`); its backward sums each token's k row gradients with one
  `embedding_bag` (a fused gather-and-sum; autograd's own backward of `index_select` is an `index_add`, which
  ran 3-4x slower on CPU and uses atomics on a GPU).
- `expert_mlp_grouped`: the up and down GEMMs over all experts at once (`moe_gemm.grouped_mm`) with the
  activation between them; the combine weight multiplies the activation (w * act(h)) @ W_down = w * (act(h)
  @ W_down), so no pass over the (T x k, d_model) output is spent on it, and the weight's gradient comes from
  the narrower (T x k, d_ff) activation in the same backward.
- `combine` sums each token's k (already weighted) rows with `embedding_bag` (un-permutation and combine in
  one kernel); its backward is a gather of the output gradient.
Backward passes reuse the forward's indices: nothing is sorted again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stepscope.nn.moe_gemm import Groups, grouped_mm
from stepscope.nn.moe_routing import Routing


@dataclass
class Dispatch:
    """Where the assignments of one forward sit in the buffer sorted by expert."""

    token_of_row: torch.Tensor
    """(T*k,) the token each row of the sorted buffer comes from."""
    bags: torch.Tensor
    """(T, k) the row of each assignment (the inverse permutation)."""
    expert_of_row: torch.Tensor
    """(T*k,) the expert of each row (non-decreasing)."""
    groups: Groups
    """Rows per expert (all assignments, dropped ones included)."""
    order: torch.Tensor
    """(T*k,) `Routing.order`: the flat assignment in each row."""

    @classmethod
    def of(cls, routing: Routing) -> Dispatch:
        tokens, k = routing.experts.shape
        order = routing.order
        position = torch.arange(order.numel(), device=order.device)
        bags = torch.empty_like(order).scatter_(0, order, position).view(tokens, k)
        expert_of_row = routing.experts.reshape(-1).index_select(0, order)
        return cls(order // k, bags, expert_of_row, Groups(routing.counts), order)

    def row_weights(self, routing: Routing) -> torch.Tensor:
        """(T*k,) the combine weight of each row, 0 for dropped assignments (differentiable)."""
        return routing.kept_weights().reshape(-1).index_select(0, self.order)


class _Permute(torch.autograd.Function):
    """x (T, d) -> rows (T*k, d) sorted by expert; backward: each token's k row gradients summed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, token_of_row: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(token_of_row, bags)
        return x.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        _, bags = ctx.saved_tensors
        return F.embedding_bag(bags, grad.contiguous(), mode="sum"), None, None


class _Combine(torch.autograd.Function):
    """rows (T*k, d) sorted by expert -> (T, d), each token's k rows summed; backward: the gradient gathered."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, token_of_row: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(token_of_row, bags)
        return F.embedding_bag(bags, rows, mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        token_of_row, _ = ctx.saved_tensors
        return grad.index_select(0, token_of_row), None, None


def permute(x: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
    """The token rows in expert order, (T*k, d)."""
    return _Permute.apply(x, dispatch.token_of_row, dispatch.bags)


def combine(rows: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
    """Each token's k rows summed, (T, d) (the rows carry their combine weights already)."""
    return _Combine.apply(rows.contiguous(), dispatch.token_of_row, dispatch.bags)


class _WeightedSwiGLU(torch.autograd.Function):
    """h = [gate | up] (N, 2f), w (N,) -> w * silu(gate) * up (N, f). The backward writes both halves of the
    gradient into one (N, 2f) tensor (autograd's `chunk` backward zero-fills a full-size tensor per half)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(h, w)
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up * w.unsqueeze(1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        h, w = ctx.saved_tensors
        gate, up = h.chunk(2, dim=-1)
        act = F.silu(gate)
        grad_w = (grad * act * up).sum(dim=-1)
        weighted = grad * w.unsqueeze(1)
        if torch.compiler.is_compiling():  # dynamo breaks the graph at an `out=` into a strided view
            grad_h = torch.cat([torch.ops.aten.silu_backward(weighted * up, gate), weighted * act], dim=-1)
            return grad_h, grad_w.to(w.dtype)
        grad_h = torch.empty_like(h)  # eagerly, both halves are written in place: no concatenation pass
        grad_gate, grad_up = grad_h.chunk(2, dim=-1)
        torch.ops.aten.silu_backward.grad_input(weighted * up, gate, grad_input=grad_gate)
        torch.mul(weighted, act, out=grad_up)
        return grad_h, grad_w.to(w.dtype)


class _WeightedGELU(torch.autograd.Function):
    """h (N, f), w (N,) -> w * gelu_tanh(h) (the GPT-2 MLP's activation)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(h, w)
        return F.gelu(h, approximate="tanh") * w.unsqueeze(1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        h, w = ctx.saved_tensors
        grad_w = (grad * F.gelu(h, approximate="tanh")).sum(dim=-1)
        grad_h = torch.ops.aten.gelu_backward(grad * w.unsqueeze(1), h, approximate="tanh")
        return grad_h, grad_w.to(w.dtype)


def weighted_activation(h: torch.Tensor, w: torch.Tensor, gated: bool) -> torch.Tensor:
    """w * silu(gate) * up (SwiGLU, h = [gate | up]) or w * gelu(h), per row."""
    return (_WeightedSwiGLU if gated else _WeightedGELU).apply(h, w.to(h.dtype))


def expert_mlp_grouped(rows: torch.Tensor, row_weights: torch.Tensor | None, dispatch_groups: Groups,
                       expert_of_row: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                       b_up: torch.Tensor | None, b_down: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """Every expert on its rows (sorted by expert, `dispatch_groups`), each row's output times its weight
    (None: 1). Weights (E, d, f'), (E, f, d), biases (E, f'), (E, d) as `RoutedExperts` holds them."""
    h = grouped_mm(rows, w_up, dispatch_groups)
    if b_up is not None:
        h = h + b_up.index_select(0, expert_of_row)
    w = row_weights if row_weights is not None else rows.new_ones(rows.shape[0])
    y = grouped_mm(weighted_activation(h, w, gated), w_down, dispatch_groups)
    if b_down is not None:
        y = y + w.to(y.dtype).unsqueeze(1) * b_down.index_select(0, expert_of_row)
    return y


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the expert GEMMs run in: autocast's where it is on (it does not cast `torch._grouped_mm`'s
    operands, nor the custom functions' here), else x's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype
