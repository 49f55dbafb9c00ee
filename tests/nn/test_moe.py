"""MoE blocks: the grouped fast path equals the reference loop in forward and backward,
dropless and capacity-limited, with experts that receive no tokens; routing, aux loss, FLOPs."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from stepscope.errors import UsageError
from stepscope.nn import TransformerLM, lm_loss
from stepscope.nn.moe import MoE, Router
from stepscope.nn.transformer import MLP
from stepscope.spec import get_preset


def close(a, b, tol=1e-5):
    """fp32 agreement relative to the tensor's scale (sums taken in another order differ in the last bits)."""
    return (a - b).abs().max().item() <= tol * max(b.abs().max().item(), 1e-12)


def _grads_of(block, x):
    block.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = block(x)
    (y.square().sum() + block.aux_loss).backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)) for name, p in block.named_parameters()}
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("overrides, tokens", [
    ({}, 64),                                                     # softmax, dropless
    ({"capacity_factor": 1.0}, 64),                               # capacity-limited: some assignments dropped
    ({"n_experts": 8, "experts_per_token": 2}, 3),               # 3 tokens, 8 experts: most experts get none
    ({"router": "sigmoid", "capacity_factor": 1.25}, 40),
    ({"mlp": "gelu", "mlp_bias": True, "n_shared_experts": 2}, 32),
])
def test_grouped_equals_reference_forward_and_backward(overrides, tokens):
    torch.manual_seed(0)
    spec = get_preset("tiny-moe", **overrides)
    block = MoE(spec, "reference", shared=MLP)
    for p in block.parameters():  # biases too, so a wrong bias path shows
        torch.nn.init.normal_(p, std=0.1)
    if spec.router == "sigmoid":
        block.router.bias[0] = 1.0  # expert 0 overloaded: its capacity drops assignments
    x = torch.randn(1, tokens, spec.d_model)
    routing = block.router(x.view(tokens, -1))
    counts = torch.bincount(routing.experts[routing.keep], minlength=spec.n_experts)
    if spec.capacity_factor:
        capacity = math.ceil(spec.capacity_factor * tokens * spec.experts_per_token / spec.n_experts)
        assert not routing.keep.all() and counts.max() <= capacity
    if tokens < spec.n_experts:
        assert (counts == 0).any()
    ref = _grads_of(block, x)
    block.experts.impl = "grouped"
    fast = _grads_of(block, x)
    assert close(fast[0], ref[0]) and close(fast[1], ref[1])
    for name, grad in ref[2].items():
        assert close(fast[2][name], grad), name


def test_bf16_autocast_runs_both_implementations_alike():
    torch.manual_seed(0)
    spec = get_preset("tiny-moe", capacity_factor=1.0)
    model = TransformerLM(spec, moe_impl="grouped")
    tokens = torch.randint(0, spec.vocab_size, (2, 17))
    losses = []
    for impl in ("grouped", "reference"):
        model.set_moe_impl(impl)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:]) + 0.01 * model.aux_loss
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-2)


def test_dropped_assignments_contribute_nothing():
    torch.manual_seed(0)
    spec = get_preset("tiny-moe", n_shared_experts=0, capacity_factor=1.0)
    block = MoE(spec, "grouped")
    x = torch.randn(48, spec.d_model)
    routing = block.router(x)
    dropped = ~routing.keep
    assert dropped.any()
    routing.weights = routing.weights.masked_fill(dropped, 1e6)  # a dropped assignment would blow up the output
    unlimited = MoE(spec.replace(capacity_factor=0.0), "grouped")
    unlimited.load_state_dict(block.state_dict())
    out = block.experts(x, routing)
    assert out.abs().max() < 1e3
    full = unlimited.experts(x, unlimited.router(x))
    assert not torch.allclose(out, full, atol=1e-4)  # dropping changed something


def test_softmax_weights_renormalised_and_aux_loss_uniform_vs_collapsed():
    torch.manual_seed(0)
    spec = get_preset("tiny-moe")
    router = Router(spec)
    x = torch.randn(256, spec.d_model)
    routing = router(x)
    assert torch.allclose(routing.weights.sum(-1), torch.ones(256), atol=1e-6)
    torch.nn.init.zeros_(router.gate.weight)  # uniform probabilities, ties: every token to experts 0 and 1
    assert router(x).aux_loss.item() == pytest.approx(1.0, rel=1e-6)
    collapsed = Router(spec.replace(experts_per_token=1))
    with torch.no_grad():
        collapsed.gate.weight.zero_()
        collapsed.gate.weight[0] = 100.0
    x = x.abs() + 0.1  # every token's top expert is 0 with probability ~1
    assert collapsed(x).aux_loss.item() == pytest.approx(spec.n_experts, rel=1e-3)


def test_sigmoid_bias_moves_selection_not_weights():
    torch.manual_seed(0)
    spec = get_preset("tiny-moe", router="sigmoid", experts_per_token=1)
    router = Router(spec)
    x = torch.randn(32, spec.d_model)
    before = router(x)
    router.bias[3] = 10.0
    after = router(x)
    assert (after.experts == 3).all() and not (before.experts == 3).all()
    scores = torch.sigmoid(router.gate(x))
    assert torch.allclose(after.weights, torch.ones(32, 1))  # k=1: renormalised weight is 1 either way
    assert "bias" not in dict(router.named_parameters()) and scores.shape == (32, spec.n_experts)
    router.balance_bias(torch.bincount(after.experts.reshape(-1), minlength=spec.n_experts), rate=0.5)
    assert router.bias[3] == 9.5 and (router.bias[:3] == 0.5).all()  # overloaded down, idle up


def test_training_flops_equal_the_spec_formula():
    """FlopCounterMode on forward + backward of tiny-moe (reference experts: no padding rows; naive attention:
    full score matrices) equals tokens x flops_per_token(causal=False), router and activated experts only."""
    torch.manual_seed(0)
    spec = get_preset("tiny-moe")
    model = TransformerLM(spec, attention="naive", moe_impl="reference")
    tokens = torch.randint(0, spec.vocab_size, (2, 17))
    with FlopCounterMode(display=False) as counter:
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:]) + 0.01 * model.aux_loss
        loss.backward()
    assert counter.get_total_flops() == 2 * 16 * spec.flops_per_token(16, causal=False)


@pytest.mark.parametrize("router_kind", ["softmax", "sigmoid"])
def test_group_limited_routing_keeps_each_token_in_its_best_groups(router_kind):
    """With 8 experts in 4 groups and 2 groups per token, a token's top-3 lie in at most 2 groups, and those are
    the groups whose two best scores sum highest; without the limit some token spreads over 3 groups."""
    torch.manual_seed(0)
    spec = get_preset("tiny-moe", n_experts=8, experts_per_token=3, router=router_kind)
    free = Router(spec)
    limited = Router(spec.replace(expert_groups=4, groups_per_token=2))
    limited.load_state_dict(free.state_dict())
    x = torch.randn(256, spec.d_model)
    groups = limited(x).experts // 2
    assert max(len(set(row.tolist())) for row in groups) <= 2
    assert max(len(set(row.tolist())) for row in free(x).experts // 2) == 3
    logits = limited.gate(x).float()
    scores = logits.softmax(-1) if router_kind == "softmax" else logits.sigmoid()
    best = scores.view(256, 4, 2).sum(-1).topk(2, dim=-1).indices.sort(-1).values
    for row, allowed in zip(groups, best, strict=True):
        assert set(row.tolist()) <= set(allowed.tolist())


def test_group_limited_routing_rules():
    spec = get_preset("tiny-moe")
    for changes, message in (({"expert_groups": 3}, "does not divide n_experts"),
                             ({"expert_groups": 2, "groups_per_token": 3}, "groups_per_token must be in"),
                             ({"groups_per_token": 1}, "needs expert_groups"),
                             ({"expert_groups": 4, "groups_per_token": 1, "experts_per_token": 2}, "exceeds")):
        with pytest.raises(UsageError, match=message):
            spec.replace(**changes)
