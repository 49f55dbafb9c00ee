"""The fast path's pieces on their own: the one sort (ranks, counts), the permutation and combine with their
hand-written backwards, the weighted activations, both grouped GEMMs (against per-group matmuls and by
gradcheck, empty groups included), which GEMM runs where, and the block under torch.compile in bf16 (the dtype,
int32 offsets and 16-byte strides `torch._grouped_mm` demands on sm_90 are what its meta function checks)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.nn.moe import MoE
from stepscope.nn.moe_dispatch import Dispatch, combine, permute, weighted_activation
from stepscope.nn.moe_gemm import Groups, force_grouped_mm_kind, grouped_mm, grouped_mm_kind
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


def _dispatch(tokens: int, k: int, n_experts: int, seed: int) -> Dispatch:
    experts = torch.rand(tokens, n_experts, generator=torch.Generator().manual_seed(seed)).topk(k).indices
    order, counts, _ = sort_by_expert(experts, n_experts)
    routing = Routing(experts, torch.ones(tokens, k), torch.ones_like(experts, dtype=torch.bool), order, counts,
                      None, torch.zeros(()))
    return Dispatch.of(routing)


def test_permute_and_combine_by_hand_and_by_gradcheck():
    dispatch = _dispatch(tokens=5, k=2, n_experts=4, seed=0)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    rows = permute(x, dispatch)
    assert torch.equal(rows, x[dispatch.token_of_row])
    assert torch.equal(dispatch.expert_of_row, dispatch.expert_of_row.sort().values)  # rows in expert order
    back = combine(rows, dispatch)
    assert torch.allclose(back, 2 * x)  # each token's k = 2 rows summed
    torch.autograd.gradcheck(lambda t: permute(t, dispatch), (x,))
    y = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: combine(t, dispatch), (y,))


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


@pytest.mark.parametrize("kind", ["grouped_mm", "loop"])
def test_grouped_gemm_equals_a_matmul_per_group_with_empty_groups(kind):
    if kind == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    sizes = [3, 0, 5, 0, 4]  # two experts without rows
    groups = Groups.of_sizes(sizes, torch.device("cpu"))
    a = torch.randn(12, 8, requires_grad=True)
    b = torch.randn(5, 8, 12, requires_grad=True)
    grad = torch.randn(12, 12)
    force_grouped_mm_kind(kind)
    try:
        out = grouped_mm(a, b, groups)
        out.backward(grad)
    finally:
        force_grouped_mm_kind(None)
    bounds = [(0, 3), (3, 3), (3, 8), (8, 8), (8, 12)]
    expected = torch.cat([a.detach()[s:e] @ b.detach()[g] for g, (s, e) in enumerate(bounds)])
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
    grad_b = torch.stack([a.detach()[s:e].t() @ grad[s:e] for s, e in bounds])
    assert torch.allclose(b.grad, grad_b, rtol=1e-5, atol=1e-5) and b.grad[1].abs().max() == 0
    grad_a = torch.cat([grad[s:e] @ b.detach()[g].t() for g, (s, e) in enumerate(bounds)])
    assert torch.allclose(a.grad, grad_a, rtol=1e-5, atol=1e-5)


def test_loop_gemm_gradcheck():
    groups = Groups.of_sizes([2, 0, 3], torch.device("cpu"))
    a = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, y: grouped_mm(x, y, groups), (a, b))  # float64: the loop


def test_which_grouped_gemm_runs_where():
    cpu = torch.device("cpu")
    assert grouped_mm_kind(cpu, torch.float64, (64, 128)) == "loop"  # _grouped_mm has no float64
    assert grouped_mm_kind(cpu, torch.float32, (64, 6)) == "loop"  # 6 x 4 bytes: rows not 16-byte aligned
    assert grouped_mm_kind(cpu, torch.bfloat16, (64, 12)) == "loop"  # 12 x 2 bytes: neither
    if hasattr(torch, "_grouped_mm"):
        assert grouped_mm_kind(cpu, torch.float32, (64, 128)) == "grouped_mm"
        assert grouped_mm_kind(cpu, torch.bfloat16, (64, 8)) == "grouped_mm"


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
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = block(x)
        compiled = torch.compile(block, backend="aot_eager")(x)
    compiled.float().sum().backward()
    assert torch.equal(eager, compiled)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert x.grad is not None and block.experts.w_up.grad.abs().max() > 0
