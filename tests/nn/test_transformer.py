"""TransformerLM: parameter counts equal the closed forms, shapes, causality, attention backends agree."""

import pytest
import torch

from stepscope.nn import TransformerLM, get_attention, lm_loss
from stepscope.nn.moe import RoutedExperts
from stepscope.spec import get_preset, list_presets


@pytest.mark.parametrize("name", list_presets())
def test_instantiated_parameter_count_equals_closed_form(name):
    spec = get_preset(name)
    if spec.param_count() > 20e9:
        # same per-block formulas, fewer modules to build (an MoE preset keeps its dense blocks and two MoE ones)
        spec = spec.replace(n_layers=spec.dense_layers + 2)
    with torch.device("meta"):
        model = TransformerLM(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    # a token multiplies by k of the n_experts stacked routed experts of each MoE block
    routed = sum(m.w_up.numel() + m.w_down.numel() for m in model.modules() if isinstance(m, RoutedExperts))
    routed_used = routed * spec.experts_per_token // spec.n_experts if spec.is_moe else 0
    assert linear_weights + routed_used == spec.matmul_params()


def test_gpt2_parameter_order_starts_with_embeddings_and_ties_head():
    with torch.device("meta"):
        model = TransformerLM(get_preset("gpt2"))
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"] and names[-1] == "norm_f.bias"
    assert model.lm_head.weight is model.tok_emb.weight


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"norm": "layer", "mlp": "gelu",
                                                               "positions": "learned", "tie_embeddings": True,
                                                               "attn_bias": True, "mlp_bias": True}])
def test_shapes_causality_and_backends_agree(overrides):
    torch.manual_seed(0)
    spec = get_preset("tiny", **overrides)
    model = TransformerLM(spec, attention="naive").eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 24))
    with torch.no_grad():
        naive = model(tokens)
        assert naive.shape == (2, 24, spec.vocab_size)
        changed = tokens.clone()
        changed[:, 12:] = (changed[:, 12:] + 1) % spec.vocab_size
        assert torch.allclose(model(changed)[:, :12], naive[:, :12], atol=1e-6)
        assert not torch.allclose(model(changed)[:, 12:], naive[:, 12:], atol=1e-3)
        model.set_attention("sdpa")
        assert torch.allclose(model(tokens), naive, rtol=1e-5, atol=1e-5)


def test_naive_and_sdpa_gradients_agree():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grads = []
    for name in ("naive", "sdpa"):
        out = get_attention(name)(q, k, v, True)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)


def test_loss_is_log_vocab_at_init():
    torch.manual_seed(0)
    spec = get_preset("tiny")
    model = TransformerLM(spec)
    tokens = torch.randint(0, spec.vocab_size, (4, 33))
    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    assert abs(loss.item() - torch.log(torch.tensor(float(spec.vocab_size))).item()) < 0.1
    with pytest.raises(ValueError, match="exceeds context_length"):
        model(torch.zeros(1, spec.context_length + 1, dtype=torch.long))
