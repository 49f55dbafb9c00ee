"""The grouped fast path of the routed experts, piece by piece: permute the tokens into the expert buffer, run
the experts as one GEMM per matrix over all experts, put the rows back and sum them per token.

Every piece reads the router's one sort (`Routing.order`, `Routing.rank`) and sorts nothing again:
- `Dispatch` places each assignment on a row of the expert buffer, in the layout the GEMMs want (`moe_gemm`,
  which also says which runs where): `grouped_mm` rows sorted by expert (row = the assignment's position in
  the sort; every assignment has a row, dropped ones with weight 0: static shapes, no host sync), or `bmm`
  blocks of `per_expert` rows (row = expert x per_expert + rank; the unused rows zero-weighted, the dropped
  assignments pointed at a zero-weighted spare row). `bags` (T, k) is the row of each assignment,
  `token_of_row` the token each row reads. The expert-parallel dispatcher, which must not send dropped rows,
  packs the kept ones instead (`distributed.expert_parallel`).
- `permute` gathers the rows (`index_select`); its backward sums each token's k row gradients with one
  `embedding_bag` (a fused gather-and-sum; autograd's own backward of `index_select` is an `index_add`, which
  ran 3-4x slower on CPU and uses atomics on a GPU).
- `expert_mlp_grouped`: both expert GEMMs with the activation between them; the combine weight multiplies the
  activation, (w * act(h)) @ W_down = w * (act(h) @ W_down), so no pass over the (rows, d_model) output is spent
  on it and the weight's gradient comes from the narrower (rows, d_ff) activation in the same backward. A row
  of weight 0 (padding, dropped) contributes exactly 0 and passes no gradient to the experts or the input.
- `combine` sums each token's k (already weighted) rows with `embedding_bag` (un-permutation and combine in
  one kernel); its backward is a gather of the output gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stepscope.nn.moe_gemm import Layout, choose_layout, expert_matmul
from stepscope.nn.moe_routing import Routing

MOE_RANGE_PREFIX = "stepscope.moe."
"""Profiler ranges around the MoE pieces: stepscope.moe.router, .dispatch, .experts, .combine, .shared."""


def moe_range(piece: str) -> torch.profiler.record_function:
    """The profiler range of one piece. The backwards written here open it too: `profile` gives an autograd
    node the piece of the forward op that made it, which it cannot match for a custom function's node."""
    return torch.profiler.record_function(MOE_RANGE_PREFIX + piece)


@dataclass
class Dispatch:
    """Where the assignments of one forward sit in the expert buffer."""

    token_of_row: torch.Tensor
    """(rows,) the token each row of the buffer reads (any token for a zero-weighted padding row)."""
    bags: torch.Tensor
    """(T, k) the row of each assignment."""
    layout: Layout

    @classmethod
    def of(cls, routing: Routing, kind: str) -> Dispatch:
        """The rows of `routing`'s assignments in the layout of GEMM `kind` (`moe_gemm.gemm_kind`; `auto` reads
        the busiest expert's count and chooses)."""
        tokens, k = routing.experts.shape
        flat = routing.experts.reshape(-1)
        token = torch.arange(tokens * k, device=flat.device) // k
        n_experts = routing.counts.numel()
        per_expert = 0
        if kind != "grouped_mm":  # the layer's one host sync; with a capacity, a spare row per block for the dropped
            per_expert = int(routing.kept_counts.max()) + (1 if routing.capacity is not None else 0)
            kind = choose_layout(n_experts, per_expert, tokens * k) if kind == "auto" else kind
        if kind == "grouped_mm":
            order = routing.order
            bags = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
            layout = Layout.sorted(routing.counts, flat.index_select(0, order))
            return cls(token.index_select(0, order), bags.view(tokens, k), layout)
        rank = torch.where(routing.keep, routing.rank, per_expert - 1).reshape(-1)
        bags = flat * per_expert + rank
        token_of_row = torch.zeros(n_experts * per_expert, dtype=torch.long, device=flat.device)
        token_of_row.scatter_(0, bags, token)
        return cls(token_of_row, bags.view(tokens, k), Layout.padded(n_experts, per_expert, flat.device))

    def row_weights(self, routing: Routing) -> torch.Tensor:
        """(rows,) the combine weight of each row: 0 for padding rows and dropped assignments (differentiable)."""
        weights = routing.kept_weights().reshape(-1)
        return weights.new_zeros(self.layout.rows).scatter(0, self.bags.reshape(-1), weights)


class _Permute(torch.autograd.Function):
    """x (T, d) -> the rows of the expert buffer; backward: each token's k row gradients summed. A padding row
    (in no bag) passes no gradient: in the block its weight is 0, so its gradient is 0 anyway."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, token_of_row: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(token_of_row, bags)
        return x.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        _, bags = ctx.saved_tensors
        with moe_range("dispatch"):
            return F.embedding_bag(bags, grad.contiguous(), mode="sum"), None, None


class _Combine(torch.autograd.Function):
    """rows of the expert buffer -> (T, d), each token's k rows summed; backward: the gradient gathered (a padding
    row receives its token's, which its weight 0 stops before it reaches a parameter)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, token_of_row: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(token_of_row, bags)
        return F.embedding_bag(bags, rows, mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        token_of_row, _ = ctx.saved_tensors
        with moe_range("combine"):
            return grad.index_select(0, token_of_row), None, None


def permute(x: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
    """The token rows in the expert buffer, (rows, d)."""
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
        with moe_range("experts"):
            return _swiglu_backward(grad, h, w)


def _swiglu_backward(grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = h.chunk(2, dim=-1)
    act = F.silu(gate)
    grad_w = (grad * act * up).sum(dim=-1).to(w.dtype)
    weighted = grad * w.unsqueeze(1)
    if torch.compiler.is_compiling():  # dynamo breaks the graph at an `out=` into a strided view
        return torch.cat([torch.ops.aten.silu_backward(weighted * up, gate), weighted * act], dim=-1), grad_w
    grad_h = torch.empty_like(h)  # eagerly, both halves are written in place: no concatenation pass
    grad_gate, grad_up = grad_h.chunk(2, dim=-1)
    torch.ops.aten.silu_backward.grad_input(weighted * up, gate, grad_input=grad_gate)
    torch.mul(weighted, act, out=grad_up)
    return grad_h, grad_w


class _WeightedGELU(torch.autograd.Function):
    """h (N, f), w (N,) -> w * gelu_tanh(h) (the GPT-2 MLP's activation)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(h, w)
        return F.gelu(h, approximate="tanh") * w.unsqueeze(1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        h, w = ctx.saved_tensors
        with moe_range("experts"):
            grad_w = (grad * F.gelu(h, approximate="tanh")).sum(dim=-1)
            grad_h = torch.ops.aten.gelu_backward(grad * w.unsqueeze(1), h, approximate="tanh")
            return grad_h, grad_w.to(w.dtype)


def weighted_activation(h: torch.Tensor, w: torch.Tensor, gated: bool) -> torch.Tensor:
    """w * silu(gate) * up (SwiGLU, h = [gate | up]) or w * gelu(h), per row."""
    return (_WeightedSwiGLU if gated else _WeightedGELU).apply(h, w.to(h.dtype))


def expert_mlp_grouped(rows: torch.Tensor, row_weights: torch.Tensor | None, layout: Layout, w_up: torch.Tensor,
                       w_down: torch.Tensor, b_up: torch.Tensor | None, b_down: torch.Tensor | None,
                       gated: bool) -> torch.Tensor:
    """Every expert on its rows of the buffer (`layout`), each output row times its weight (None: 1). Weights
    (E, d, f'), (E, f, d), biases (E, f'), (E, d) as `RoutedExperts` holds them."""
    h = expert_matmul(rows, w_up, layout)
    if b_up is not None:
        h = h + b_up.index_select(0, layout.expert_of_row)
    w = row_weights if row_weights is not None else rows.new_ones(rows.shape[0])
    y = expert_matmul(weighted_activation(h, w, gated), w_down, layout)
    if b_down is not None:
        y = y + w.to(y.dtype).unsqueeze(1) * b_down.index_select(0, layout.expert_of_row)
    return y


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the expert GEMMs run in: autocast's where it is on (it does not cast `torch._grouped_mm`'s
    operands, nor the custom functions' here), else x's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype
