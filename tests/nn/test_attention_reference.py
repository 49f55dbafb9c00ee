"""The fp64 reference and the FLOP convention every kernel and benchmark is measured against."""

import math

import pytest
import torch

from stepscope.nn.attention_reference import (
    attention_flops,
    causal_visible,
    reference_attention,
    reference_forward_backward,
    relative_error,
)


def test_flop_convention():
    # forward = 4·BH·Nq·Nk·d; causal halves it; backward = 2.5x, fwd+bwd = 3.5x the forward
    assert attention_flops(8, 4096, 4096, 64, False, "fwd") == 4 * 8 * 4096 * 4096 * 64
    assert attention_flops(8, 4096, 4096, 64, True, "fwd") == 2 * 8 * 4096 * 4096 * 64
    assert attention_flops(2, 10, 20, 16, False, "bwd") == 2.5 * 4 * 2 * 10 * 20 * 16
    assert attention_flops(2, 10, 20, 16, True, "fwd-bwd") == 3.5 * 2 * 2 * 10 * 20 * 16


def test_causal_mask_is_top_left_aligned_like_sdpa():
    visible = causal_visible(3, 5)
    assert visible.tolist() == [[True, False, False, False, False], [True, True, False, False, False],
                                [True, True, True, False, False]]
    q, k, v = torch.randn(1, 3, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert relative_error(reference_attention(q, k, v, True), sdpa) < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_reference_equals_autograd_of_the_textbook_formula(causal):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 37, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 29, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 29, 16, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(2, 3, 37, 16, dtype=torch.float64)
    out = reference_attention(q, k, v, causal)
    out.backward(grad_out)
    blocked = reference_forward_backward(q.detach(), k.detach(), v.detach(), grad_out, causal, block=5)
    assert relative_error(blocked["out"], out) < 1e-12
    for name, tensor in (("dq", q), ("dk", k), ("dv", v)):
        assert relative_error(blocked[name], tensor.grad) < 1e-12
    scores = q.detach() @ k.detach().transpose(-2, -1) / math.sqrt(16)
    if causal:
        scores = scores.masked_fill(~causal_visible(37, 29), -1e6)
    assert relative_error(blocked["lse"], torch.logsumexp(scores, -1)) < 1e-12


def test_sampled_rows_give_exact_gradients_for_a_do_that_is_zero_elsewhere():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 50, 16, dtype=torch.float64) for _ in range(3))
    rows = torch.tensor([0, 17, 49])
    grad_out = torch.zeros(2, 50, 16, dtype=torch.float64)
    grad_out[:, rows] = torch.randn(2, 3, 16, dtype=torch.float64)
    full = reference_forward_backward(q, k, v, grad_out, True)
    sampled = reference_forward_backward(q, k, v, grad_out, True, rows=rows)
    assert sampled["out"].shape == (2, 3, 16)
    assert relative_error(sampled["out"], full["out"][:, rows]) < 1e-12
    for name in ("dq", "dk", "dv"):
        assert relative_error(sampled[name], full[name]) < 1e-12
