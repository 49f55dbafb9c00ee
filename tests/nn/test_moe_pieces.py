"""The fast path's pieces on their own: the one sort (ranks, counts), both buffer layouts, the permutation and
combine with their hand-written backwards, the weighted activations, both expert GEMMs (against per-expert
matmuls and by gradcheck, experts without rows included), which GEMM runs where, and the block under
torch.compile in bf16 (the dtype, int32 offsets and 16-byte strides `torch._grouped_mm` demands on sm_90 are
what its meta function checks)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.nn.moe import MoE
from stepscope.nn.moe_dispatch import Dispatch, combine, permute, weighted_activation
from stepscope.nn.moe_gemm import Layout, choose_layout, expert_matmul, force_gemm_kind, gemm_kind
from stepscope.nn.moe_routing import Routing, sort_by_expert
from stepscope.nn.transformer import MLP
from stepscope.spec import get_preset


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=3, max_size=3, unique=True), min_size=1, max_size=30))
def test_property_one_sort_gives_order_counts_and_first_come_first_served_ranks(assignments):
    experts = torch.tensor(assignments)
    order, counts, rank = sort_by_expert(experts, 7)
    flat = experts.reshape(-1).tolist()
    assert sorted(order.tolist()) == list(range(len(flat)))
    assert [flat[i] for i in order.tolist()] == sorted(flat)  # grouped by expert ...
    for a, b in zip(order.tolist(), order.tolist()[1:], strict=False):
        assert flat[a] < flat[b] or a < b  # ... token order within an expert
    assert counts.tolist() == [flat.count(e) for e in range(7)]
    seen: dict[int, int] = {}
    for i, e in enumerate(flat):  # the rank of an assignment: how many earlier ones chose its expert
        assert rank.reshape(-1)[i].item() == seen.get(e, 0)
        seen[e] = seen.get(e, 0) + 1


def _routing(assignments: list[list[int]], n_experts: int, capacity: int | None) -> Routing:
    experts = torch.tensor(assignments)
    order, counts, rank = sort_by_expert(experts, n_experts)
    keep = rank < capacity if capacity is not None else torch.ones_like(experts, dtype=torch.bool)
    weights = torch.arange(1.0, experts.numel() + 1).view_as(experts)
    return Routing(experts, weights, keep, rank, order, counts, capacity, torch.zeros(()))


def test_both_layouts_by_hand():
    """Four tokens, top-2 of 3 experts, capacity 3: expert 0 is chosen by all four and drops token 3's."""
    routing = _routing([[0, 1], [0, 2], [0, 1], [0, 2]], 3, capacity=3)
    assert routing.keep.tolist() == [[True, True], [True, True], [True, True], [False, True]]
    sorted_rows = Dispatch.of(routing, "grouped_mm")
    # sorted by expert, token order within: e0: t0 t1 t2 t3; e1: t0 t2; e2: t1 t3
    assert sorted_rows.token_of_row.tolist() == [0, 1, 2, 3, 0, 2, 1, 3]
    assert sorted_rows.bags.tolist() == [[0, 4], [1, 6], [2, 5], [3, 7]]
    assert sorted_rows.layout.offsets.tolist() == [4, 6, 8]
    assert sorted_rows.row_weights(routing).tolist() == [1, 3, 5, 0, 2, 6, 4, 8]  # token 3's expert 0: weight 0
    padded = Dispatch.of(routing, "bmm")  # blocks of the 3 kept + 1 spare row for the dropped
    assert padded.layout.per_expert == 4 and padded.layout.expert_of_row.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert padded.bags.tolist() == [[0, 4], [1, 8], [2, 5], [3, 9]]  # token 3's expert 0: the spare row 3
    assert padded.row_weights(routing).tolist() == [1, 3, 5, 0, 2, 6, 0, 0, 4, 8, 0, 0]
    tokens = padded.token_of_row.tolist()
    assert [tokens[r] for r in (0, 1, 2, 4, 5, 8, 9)] == [0, 1, 2, 0, 2, 1, 3]


@pytest.mark.parametrize("kind", ["grouped_mm", "bmm"])
def test_permute_and_combine_by_hand_and_by_gradcheck(kind):
    routing = _routing([[0, 1], [2, 0], [1, 2], [0, 3], [3, 1]], 4, capacity=None)
    dispatch = Dispatch.of(routing, kind)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    rows = permute(x, dispatch)
    assert torch.equal(rows, x[dispatch.token_of_row])
    back = combine(rows, dispatch)
    assert torch.allclose(back, 2 * x)  # each token's k = 2 rows summed
    # the rows of the assignments; the padded layout's spare rows read some token and carry weight 0 in the
    # block, so their gradient is 0 and the backward leaves them out
    assigned = dispatch.bags.reshape(-1)
    torch.autograd.gradcheck(lambda t: permute(t, dispatch).index_select(0, assigned), (x,))
    # the same rows of the output side: spare rows are in no bag (their gradient, times weight 0, never counts)
    base = torch.randn(dispatch.layout.rows, 3, dtype=torch.float64)
    y = torch.randn(assigned.numel(), 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: combine(base.index_copy(0, assigned, t), dispatch), (y,))


@pytest.mark.parametrize("gated", [True, False])
def test_weighted_activations_by_hand_and_by_gradcheck(gated):
    h = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    out = weighted_activation(h, w, gated)
    gate, up = h.detach()[:, :4], h.detach()[:, 4:]
    silu = gate * torch.sigmoid(gate)
    gelu = 0.5 * h.detach() * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h.detach() + 0.044715 * h.detach() ** 3)))
    expected = (silu * up if gated else gelu) * w.detach().unsqueeze(1)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(lambda a, b: weighted_activation(a, b, gated), (h, w))


@pytest.mark.parametrize("kind", ["grouped_mm", "bmm"])
def test_expert_gemm_equals_a_matmul_per_expert_with_experts_without_rows(kind):
    counts = [3, 0, 5, 0, 4]  # two experts without rows
    if kind == "grouped_mm":
        expert = torch.repeat_interleave(torch.arange(5), torch.tensor(counts))
        layout = Layout.sorted(torch.tensor(counts), expert)
        real = torch.arange(12)
    else:
        layout = Layout.padded(5, 5, torch.device("cpu"))
        real = torch.cat([torch.arange(e * 5, e * 5 + c) for e, c in enumerate(counts)])
    a = torch.randn(layout.rows, 8, requires_grad=True)
    b = torch.randn(5, 8, 12, requires_grad=True)
    grad = torch.zeros(layout.rows, 12).index_copy(0, real, torch.randn(12, 12))  # padding rows: no gradient
    out = expert_matmul(a, b, layout)
    out.backward(grad)
    expert = layout.expert_of_row
    expected = torch.stack([a.detach()[r] @ b.detach()[expert[r]] for r in range(layout.rows)])
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
    grad_b = torch.stack([sum((torch.outer(a.detach()[r], grad[r]) for r in range(layout.rows) if expert[r] == e),
                              torch.zeros(8, 12)) for e in range(5)])
    assert torch.allclose(b.grad, grad_b, rtol=1e-5, atol=1e-5) and b.grad[1].abs().max() == 0
    grad_a = torch.stack([grad[r] @ b.detach()[expert[r]].t() for r in range(layout.rows)])
    assert torch.allclose(a.grad, grad_a, rtol=1e-5, atol=1e-5)


def test_which_expert_gemm_runs_where():
    cpu = torch.device("cpu")
    assert gemm_kind(cpu, torch.float32, (64, 128)) == "auto"  # decided per layer from the counts
    assert gemm_kind(cpu, torch.bfloat16, (64, 128)) == "auto"
    assert gemm_kind(cpu, torch.float64, (64, 128)) == "bmm"  # _grouped_mm has no float64
    assert gemm_kind(cpu, torch.float32, (64, 6)) == "bmm"  # 6 x 4 bytes: rows not 16-byte aligned
    assert choose_layout(32, 160, 4096) == "bmm"  # 5,120 padded rows for 4,096: within 1.25x
    assert choose_layout(32, 161, 4096) == "grouped_mm"
    force_gemm_kind("grouped_mm")
    try:
        assert gemm_kind(cpu, torch.float64, (64, 6)) == "grouped_mm"
    finally:
        force_gemm_kind(None)
    with pytest.raises(ValueError, match="unknown expert GEMM kind"):
        force_gemm_kind("loop")


def test_auto_pads_a_balanced_routing_and_sorts_a_skewed_one():
    balanced = _routing([[0, 1], [2, 3], [1, 0], [3, 2]], 4, capacity=None)  # 2 rows each: no padding
    assert Dispatch.of(balanced, "auto").layout.kind == "bmm"
    skewed = _routing([[0, 1], [0, 2], [0, 3], [0, 1]], 4, capacity=None)  # expert 0: 4 of 8 rows, 16 padded
    assert Dispatch.of(skewed, "auto").layout.kind == "grouped_mm"


@pytest.mark.slow
def test_the_block_compiles_in_bf16_forward_and_backward_without_graph_breaks():
    """`aot_eager` traces forward and backward with fake tensors through `torch._grouped_mm`'s meta function (bf16
    operands, int32 offsets, 16-byte strides: the sm_90 kernel's rules) without generating code; capacity drops
    and a shared expert included. The compiled block equals the eager one."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    block = MoE(get_preset("tiny-moe", capacity_factor=1.0), "grouped", shared=MLP)
    x = torch.randn(24, 64, requires_grad=True)
    force_gemm_kind("grouped_mm")  # the GPU's layout: no host sync, so one graph
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            eager = block(x)
            compiled = torch.compile(block, backend="aot_eager")(x)
        compiled.float().sum().backward()
    finally:
        force_gemm_kind(None)
    assert torch.equal(eager, compiled)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert x.grad is not None and block.experts.w_up.grad.abs().max() > 0
