"""Both expert implementations, and both layouts of the fast path's GEMMs, against the independent per-token oracle
(`moe_equations`, float64): output, load-balancing loss, the input's and every parameter's gradient; softmax and
sigmoid-with-bias routers, capacity drops (asserted before comparing), experts without tokens, group-limited
routing, GELU experts with biases and shared experts. Then the same as properties over drawn shapes, top-k,
capacity factors and skews (Hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stepscope.nn.moe import MoE
from stepscope.nn.moe_gemm import force_gemm_kind
from stepscope.nn.transformer import MLP
from stepscope.spec import get_preset

from .moe_equations import Weights, choose, moe, probabilities, route

TOLERANCE = 2e-5
"""fp32 against float64, relative to the largest value of the tensor compared (sums of a few hundred products)."""


def build(spec, seed: int, bias: list[float] | None = None) -> MoE:
    torch.manual_seed(seed)
    block = MoE(spec, "grouped", shared=MLP)
    for p in block.parameters():  # biases too, and larger than the default init so that wrong paths show
        torch.nn.init.normal_(p, std=0.2)
    if bias is not None:
        block.router.bias.copy_(torch.tensor(bias))
    return block


def routing_args(block: MoE) -> dict:
    """The oracle's routing keywords for a block's router."""
    router = block.router
    return {"capacity_factor": router.capacity_factor, "groups": router.groups,
            "groups_per_token": router.groups_per_token}


def margin(block: MoE, x: torch.Tensor) -> float:
    """The smallest gap between a token's k-th and (k+1)-th selection score: fp32 and float64 pick the same experts
    only when it is well above rounding."""
    k, kind = block.router.k, block.router.kind
    bias = getattr(block.router, "bias", None)
    gaps = []
    for t in range(x.shape[0]):
        p = probabilities(block.router.gate.weight.double() @ x[t].double(), kind)
        selection = sorted((p + (bias.double() if bias is not None else 0)).tolist(), reverse=True)
        if k < len(selection):
            gaps.append(selection[k - 1] - selection[k])
    return min(gaps, default=1.0)


def oracle(block: MoE, x: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """The oracle's output, aux loss and gradients (float64), under the block's parameter names."""
    weights = Weights.of(block)
    x64 = x.double().requires_grad_()
    out, aux = moe(x64, weights, block.router.kind, block.router.k, block.experts.gated, **routing_args(block))
    ((out * grad_out.double()).sum() + aux).backward()
    want = {"output": out.detach(), "aux loss": aux.detach(), "x": x64.grad, "router.gate.weight": weights.gate.grad,
            "experts.w_up": weights.w_up.grad, "experts.w_down": weights.w_down.grad}
    if weights.b_up is not None:
        want.update({"experts.b_up": weights.b_up.grad, "experts.b_down": weights.b_down.grad})
    for i, (up, down, b_up, b_down) in enumerate(weights.shared):
        want.update({f"shared.{i}.up.weight": up.grad.t(), f"shared.{i}.down.weight": down.grad.t()})
        if b_up is not None:
            want.update({f"shared.{i}.up.bias": b_up.grad, f"shared.{i}.down.bias": b_down.grad})
    return want


def measured(block: MoE, x: torch.Tensor, grad_out: torch.Tensor, impl: str, gemm: str | None) -> dict:
    """The block's (fp32, `impl`, the expert GEMMs forced to `gemm`) output, aux loss and gradients."""
    block.experts.impl = impl
    block.zero_grad(set_to_none=True)
    x32 = x.clone().requires_grad_()
    force_gemm_kind(gemm)
    try:
        out = block(x32)
        ((out * grad_out).sum() + block.aux_loss).backward()
    finally:
        force_gemm_kind(None)
    got = {"output": out.detach(), "aux loss": block.aux_loss.detach(), "x": x32.grad}
    got.update({name: p.grad for name, p in block.named_parameters()})
    return got


def compare(block: MoE, x: torch.Tensor, runs: list[tuple[str, str | None]]) -> None:
    """Each (impl, gemm) run of the block equals the oracle in output, aux loss and every gradient."""
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    want = oracle(block, x, grad_out)
    for impl, gemm in runs:
        got = measured(block, x, grad_out, impl, gemm)
        assert set(got) == set(want)
        for name, expected in want.items():
            value = got[name] if got[name] is not None else torch.zeros_like(expected)  # an unused expert: None
            scale = expected.abs().max().item()
            error = (value.double() - expected).abs().max().item()
            assert error <= TOLERANCE * max(scale, 1e-12), f"{impl}/{gemm} {name}: error {error:.3g}, scale {scale:.3g}"


RUNS = [("grouped", "bmm"), ("grouped", "grouped_mm"), ("reference", None)]
"""The fast path in both layouts (padded bmm, as on a CPU; torch._grouped_mm's sorted rows, which the CPU build
runs in fp32 too), and the reference loop."""


CASES = {
    "softmax top-2 dropless": ({}, 24, None),
    "softmax top-3 of 8, capacity 1.0": ({"n_experts": 8, "experts_per_token": 3, "capacity_factor": 1.0}, 24, None),
    "3 tokens, 8 experts: most get none": ({"n_experts": 8, "experts_per_token": 2}, 3, None),
    "sigmoid top-3 with a bias, capacity 1.0": ({"router": "sigmoid", "n_experts": 8, "experts_per_token": 3,
                                                 "capacity_factor": 1.0}, 24,
                                                [0.3, -0.2, 0.0, 0.5, -0.4, 0.1, 0.2, 0.0]),
    "group-limited sigmoid": ({"router": "sigmoid", "n_experts": 8, "experts_per_token": 2, "expert_groups": 4,
                               "groups_per_token": 2}, 24, [0.1, 0.0, -0.1, 0.2, 0.0, 0.3, -0.2, 0.0]),
    "gelu experts with biases, 2 shared": ({"mlp": "gelu", "mlp_bias": True, "n_shared_experts": 2}, 20, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_equals_the_per_token_equations(case):
    overrides, tokens, bias = CASES[case]
    spec = get_preset("tiny-moe", **overrides)
    block = build(spec, seed=len(case), bias=bias)
    x = torch.randn(tokens, spec.d_model, generator=torch.Generator().manual_seed(tokens))
    assert margin(block, x) > 1e-4  # fp32 and float64 choose the same experts
    plan, _ = route(x.double(), block.router.gate.weight.double(), spec.router, spec.experts_per_token,
                    bias=None if bias is None else torch.tensor(bias, dtype=torch.float64), **routing_args(block))
    if spec.capacity_factor:
        assert sum(not c.kept for choices in plan for c in choices) > 0  # the capacity does drop assignments
    if tokens * spec.experts_per_token < spec.n_experts:
        assert len({c.expert for choices in plan for c in choices}) < spec.n_experts  # some experts get no token
    compare(block, x, RUNS)


def test_the_bias_selects_but_does_not_weigh():
    """DeepSeek-V3: with k = 3 the renormalised weights differ between tokens, so a bias that leaked into them
    would show. The bias changes the choice (asserted), and the weights are the bare scores of the choice."""
    spec = get_preset("tiny-moe", router="sigmoid", n_experts=8, experts_per_token=3)
    bias = [0.4, -0.3, 0.0, 0.25, -0.1, 0.15, 0.0, -0.2]
    block = build(spec, seed=3, bias=bias)
    x = torch.randn(16, spec.d_model, generator=torch.Generator().manual_seed(5))
    routing = block.router(x)
    scores = torch.sigmoid(x.double() @ block.router.gate.weight.double().t())
    for t in range(16):
        chosen = choose((scores[t] + torch.tensor(bias, dtype=torch.float64)).tolist(), 3)
        assert sorted(routing.experts[t].tolist()) == sorted(chosen)
        expected = scores[t, routing.experts[t]] / scores[t, chosen].sum()
        assert torch.allclose(routing.weights[t].double(), expected, rtol=1e-5, atol=0)
    unbiased = choose(scores[0].tolist(), 3)
    assert any(sorted(choose(scores[t].tolist(), 3)) != sorted(routing.experts[t].tolist()) for t in range(16)), \
        f"the bias moved no token's choice (token 0: {unbiased})"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.integers(1, 40), n_experts=st.integers(2, 10), k=st.integers(1, 4), width=st.sampled_from([8, 12, 16]),
       capacity=st.sampled_from([0.0, 1.0, 1.25, 2.0]), router=st.sampled_from(["softmax", "sigmoid"]),
       skew=st.floats(0.0, 3.0), seed=st.integers(0, 2**16), gemm=st.sampled_from(["bmm", "grouped_mm"]))
def test_property_grouped_equals_the_equations(tokens, n_experts, k, width, capacity, router, skew, seed, gemm):
    """Any shape, top-k, capacity factor and skew (the tokens pushed towards expert 0 by `skew` x its gate row):
    the fast path equals the oracle. k >= 2 keeps the weights' gradient away from its exact cancellation at k = 1
    (where fp32 leaves rounding noise against float64's 0)."""
    assume(2 <= k <= n_experts)
    spec = get_preset("tiny-moe", d_model=width, n_heads=2, n_experts=n_experts, experts_per_token=k, expert_d_ff=width,
                      capacity_factor=capacity, router=router, n_shared_experts=0)
    block = build(spec, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=generator)
    gate0 = block.router.gate.weight[0].detach()
    x = x + skew * gate0 / gate0.norm()
    assume(margin(block, x) > 1e-4)
    compare(block, x, [("grouped", gemm)])
