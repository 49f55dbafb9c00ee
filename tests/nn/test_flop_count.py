"""ModelSpec's FLOP formulas against the matrix multiplies a built `TransformerLM` really runs, counted by
`torch.utils.flop_counter.FlopCounterMode` in a forward and a backward pass.

The spec's convention (spec/model.py): matmuls only (2·m·k·n), no elementwise work, norms, softmax, embedding
lookups or biases (FlopCounterMode does not count those either); attention 4·s·d per token and layer with the
causal halving; backward = 2 x forward. Two things the counter sees that the convention leaves out:
- the causal halving: the model computes (naive) or is counted for (sdpa) the full s x s scores, so the count
  matches the spec's `causal=False` figure;
- a fused kernel's backward recomputes the scores Q·Kᵀ (hardware FLOPs, not model FLOPs): 2·s·d per token and
  layer more than 2 x forward.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from stepscope.nn.transformer import TransformerLM, lm_loss
from stepscope.spec import ModelSpec

aten = torch.ops.aten
BATCH, SEQ = 2, 16

# PyTorch's CPU flash kernel has no formula in FlopCounterMode's table: count it with the formulas PyTorch uses
# for the other fused kernels (the same q, k, v shapes), so sdpa is counted on every device.
def _cpu_flash(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


CPU_FLASH = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash,
             aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward}

LLAMA = ModelSpec(vocab_size=97, context_length=32, d_model=32, n_layers=2, n_heads=4, d_ff=48)
SPECS = {
    "llama-untied": LLAMA,
    "llama-gqa-tied": LLAMA.replace(n_kv_heads=2, tie_embeddings=True),
    "gpt2-tied": LLAMA.replace(norm="layer", mlp="gelu", positions="learned", tie_embeddings=True,
                               attn_bias=True, mlp_bias=True, d_ff=64),
    "gpt2-gqa-untied": LLAMA.replace(n_heads=8, n_kv_heads=2, norm="layer", mlp="gelu", positions="learned",
                                     attn_bias=True, mlp_bias=True),
}


def _count(model: TransformerLM, tokens: torch.Tensor) -> tuple[int, int]:
    """(forward FLOPs, backward FLOPs) as FlopCounterMode counts them."""
    with FlopCounterMode(display=False, custom_mapping=CPU_FLASH) as forward:
        loss = lm_loss(model(tokens), tokens)
    with FlopCounterMode(display=False, custom_mapping=CPU_FLASH) as backward:
        loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(SPECS))
def test_counted_flops_match_the_spec_convention(name, attention):
    spec = SPECS[name]
    torch.manual_seed(0)
    model = TransformerLM(spec, attention)
    tokens = torch.randint(0, spec.vocab_size, (BATCH, SEQ))
    forward, backward = _count(model, tokens)
    assert all(p.grad is not None for p in model.parameters())  # a real backward through every weight
    n_tokens = BATCH * SEQ
    spec_forward = n_tokens * spec.forward_flops_per_token(SEQ, causal=False)  # full s x s, see the docstring
    assert forward == spec_forward
    recompute = n_tokens * spec.attention_flops_per_token(SEQ, causal=False) / 2 if attention == "sdpa" else 0
    assert backward == 2 * spec_forward + recompute
    assert forward + backward - recompute == n_tokens * spec.flops_per_token(SEQ, causal=False)
    # the causal figure is the full one less half the attention term, as the convention states
    halved = n_tokens * (spec.forward_flops_per_token(SEQ, causal=False) - spec.forward_flops_per_token(SEQ))
    assert halved == n_tokens * 2 * spec.n_layers * SEQ * spec.d_model


def test_the_counter_sees_the_attention_kernels():
    """Guards the comparison above: without the attention term or the lm head the counts would differ."""
    spec = SPECS["llama-untied"]
    tokens = torch.randint(0, spec.vocab_size, (BATCH, SEQ))
    naive, _ = _count(TransformerLM(spec, "naive"), tokens)
    fused, _ = _count(TransformerLM(spec, "sdpa"), tokens)
    assert naive == fused
    without_attention = BATCH * SEQ * 2 * spec.matmul_params()
    assert naive - without_attention == BATCH * SEQ * spec.attention_flops_per_token(SEQ, causal=False) > 0
