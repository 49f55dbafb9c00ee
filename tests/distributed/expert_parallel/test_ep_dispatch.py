"""The expert-parallel dispatcher's index arithmetic, without a process group: packing the kept assignments in
expert order, finding each assignment's packed row, regrouping arrived rows by expert, and the weighted combine,
each against a plain Python loop over drawn assignments, capacities and block sizes (Hypothesis)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.distributed.expert_parallel.layer import (
    combine_kept,
    pack_kept,
    packed_row_of_assignment,
    regroup_index,
)
from stepscope.nn.moe_routing import Routing, sort_by_expert

N_EXPERTS = 6


def routing_of(assignments: list[list[int]], capacity_factor: float) -> Routing:
    experts = torch.tensor(assignments)
    tokens, k = experts.shape
    order, counts, rank = sort_by_expert(experts, N_EXPERTS)
    capacity = math.ceil(capacity_factor * tokens * k / N_EXPERTS) if capacity_factor else None
    keep = rank < capacity if capacity is not None else torch.ones_like(experts, dtype=torch.bool)
    weights = torch.rand(tokens, k, generator=torch.Generator().manual_seed(tokens))
    return Routing(experts, weights, keep, rank, order, counts, capacity, torch.zeros(()))


assignment_lists = st.integers(1, 3).flatmap(lambda k: st.lists(
    st.lists(st.integers(0, N_EXPERTS - 1), min_size=k, max_size=k, unique=True), min_size=1, max_size=24))


@settings(max_examples=40, deadline=None)
@given(assignments=assignment_lists, capacity_factor=st.sampled_from([0.0, 1.0, 1.5]),
       skew=st.integers(0, 10))
def test_property_only_kept_assignments_are_packed_in_expert_order(assignments, capacity_factor, skew):
    """`skew` extra tokens all choose expert 0 first, so that capacities bind."""
    k = len(assignments[0])
    assignments = assignments + [[0, *range(1, k)]] * skew
    routing = routing_of(assignments, capacity_factor)
    flat = routing.experts.reshape(-1).tolist()
    keep = routing.keep.reshape(-1).tolist()
    served: dict[int, int] = {}
    expected_keep = []
    for e in flat:  # first come first served, in token order
        expected_keep.append(routing.capacity is None or served.get(e, 0) < routing.capacity)
        served[e] = served.get(e, 0) + 1
    assert keep == expected_keep
    kept = sum(keep)
    packed = pack_kept(routing, kept).tolist()
    assert packed == sorted((i for i in range(len(flat)) if keep[i]), key=lambda i: (flat[i], i))
    assert routing.kept_counts.sum().item() == kept
    rows = packed_row_of_assignment(routing).reshape(-1).tolist()
    for i in range(len(flat)):
        if keep[i]:
            assert packed[rows[i]] == i


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_property_regroup_index_concatenates_the_blocks(sizes):
    starts = []
    total = 0
    for size in reversed(sizes):  # blocks taken from an arrival order that differs from the output order
        starts.insert(0, total)
        total += size
    index = regroup_index(starts, sizes, torch.device("cpu")).tolist()
    assert index == [row for start, size in zip(starts, sizes, strict=True) for row in range(start, start + size)]


def test_combine_weighs_kept_rows_and_ignores_dropped_ones():
    routing = routing_of([[0, 1], [0, 2], [0, 1], [3, 0]], capacity_factor=1.0)  # capacity 2: expert 0 drops two
    assert routing.keep.tolist() == [[True, True], [True, True], [False, True], [True, False]]
    kept = int(routing.keep.sum())
    packed = pack_kept(routing, kept)
    back = torch.randn(kept, 3)  # the rows the experts returned, in packed order
    rows = packed_row_of_assignment(routing)
    out = combine_kept(back, routing, rows)
    flat = packed.tolist()
    for t in range(4):
        expected = torch.zeros(3)
        for j in range(2):
            if routing.keep[t, j]:
                expected += routing.weights[t, j] * back[flat.index(2 * t + j)]
        assert torch.allclose(out[t], expected, atol=1e-6)
    empty = combine_kept(back[:0], routing, rows)  # every assignment dropped on some rank: zeros, not an error
    assert empty.shape == (4, 3) and not empty.any()


@pytest.mark.parametrize("kind", ["bmm", "grouped_mm"])
def test_arrived_rows_meet_their_experts_in_either_layout(kind):
    """Rank 0 of 2 owns experts 0 and 1 of 4; rows arrive in [source][expert] blocks of sizes 2, 0 | 1, 3 (expert 1
    gets rows from both sources, expert 0 from one), each comes back in arrival order through its own expert."""
    from stepscope.distributed.expert_parallel.layer import ExpertParallelMoE
    from stepscope.nn.moe import MoE
    from stepscope.nn.moe_gemm import force_gemm_kind
    from stepscope.nn.transformer import MLP
    from stepscope.spec import get_preset
    from tests.nn.moe_equations import ffn

    torch.manual_seed(0)
    block = MoE(get_preset("tiny-moe", mlp="gelu", mlp_bias=True), "reference", shared=MLP)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    layer = ExpertParallelMoE(block, rank=0, world=2)
    received = [2, 0, 1, 3]
    arrived = torch.randn(6, 64)
    experts_of_arrival = [0, 0, 0, 1, 1, 1]
    force_gemm_kind(kind)
    try:
        out = layer._experts(arrived, received)
    finally:
        force_gemm_kind(None)
    e = block.experts
    for row, expert in enumerate(experts_of_arrival):
        expected = ffn(arrived[row].double(), e.w_up[expert].double(), e.w_down[expert].double(),
                       e.b_up[expert].double(), e.b_down[expert].double(), gated=False)
        assert torch.allclose(out[row].double(), expected, rtol=1e-5, atol=1e-5)
