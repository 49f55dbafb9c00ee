"""Per-op accounting against closed forms: parameters (and TransformerLM itself), FLOPs (6N + attention),
activation memory (Korthikanti et al. 2022)."""

import pytest

from stepscope.perfmodel.model.op_types import Geometry
from stepscope.perfmodel.model.ops import embedding_ops, head_ops, layer_ops
from stepscope.perfmodel.model.terms import activation_bytes
from stepscope.spec import get_preset

ARCHITECTURES = [  # (preset, overrides): GPT-2 style, Llama style with GQA, untied learned, tied rope
    ("gpt2", dict(n_layers=2)),
    ("llama3-8b", dict(n_layers=2, d_model=256, n_heads=8, n_kv_heads=2, d_ff=512, vocab_size=1000)),
    ("small", dict(n_layers=2, positions="learned", norm="layer", attn_bias=True)),
    ("tiny", dict(tie_embeddings=True, mlp="gelu", mlp_bias=True)),
]


def all_ops(spec, g):
    return layer_ops(spec, g) * spec.n_layers + embedding_ops(spec, g) + head_ops(spec, g)


@pytest.mark.parametrize("name, overrides", ARCHITECTURES)
def test_parameters_equal_the_closed_form_and_the_instantiated_model(name, overrides):
    import torch

    from stepscope.nn import TransformerLM

    spec = get_preset(name, **overrides)
    g = Geometry(micro_batch=1, seq=16)
    total = sum(op.params for op in all_ops(spec, g))
    assert total == spec.param_count()
    with torch.device("meta"):
        model = TransformerLM(spec)
    assert total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_every_matrix_and_replicates_norms(tp):
    spec = get_preset("gpt3-175b")
    one, sharded = Geometry(1, 2048), Geometry(1, 2048, tp=tp)
    replicated = 2 * spec.norm_params() + spec.d_model * (1 if spec.attn_bias else 0) + spec.d_model  # row biases
    layer_full = sum(op.params for op in layer_ops(spec, one))
    layer_tp = sum(op.params for op in layer_ops(spec, sharded))
    assert layer_tp == pytest.approx((layer_full - replicated) / tp + replicated)


@pytest.mark.parametrize("name, overrides", ARCHITECTURES)
@pytest.mark.parametrize("flash", [True, False])
def test_model_flops_equal_6N_plus_causal_attention(name, overrides, flash):
    spec = get_preset(name, **overrides)
    batch, seq = 3, 64
    g = Geometry(micro_batch=batch, seq=seq, flash_attention=flash, dropout=True)
    ops = all_ops(spec, g)
    forward = sum(op.forward.model_flops for op in ops)
    backward = sum(op.backward.model_flops for op in ops)
    tokens = batch * seq
    assert forward == pytest.approx(tokens * spec.forward_flops_per_token(seq, causal=True))
    assert forward + backward == pytest.approx(tokens * spec.flops_per_token(seq, causal=True))
    n = spec.matmul_params()
    attention = 12 * spec.n_layers * seq * spec.d_model / 2  # 3 x (4·L·s·h), halved by the causal mask
    assert forward + backward == pytest.approx(tokens * (6 * n + attention))


def test_unfused_attention_executes_the_full_square_and_flash_half():
    spec = get_preset("gpt2")
    for flash, factor in ((False, 1.0), (True, 0.5)):
        g = Geometry(micro_batch=2, seq=512, flash_attention=flash)
        core = [op for op in layer_ops(spec, g) if op.name in ("scores", "values", "flash_attention")]
        executed = sum(op.forward.flops for op in core)
        assert executed == pytest.approx(factor * 4 * 2 * 512 * 512 * spec.d_model)


GPT = get_preset("gpt3-175b")  # GELU 4h MLP, multi-head attention: the Korthikanti setting
S, B, H, A = 2048, 1, GPT.d_model, GPT.n_heads


def activations(recompute, tp=1, sp=False, flash=False):
    g = Geometry(micro_batch=B, seq=S, act_bytes=2, tp=tp, sequence_parallel=sp, flash_attention=flash, dropout=True)
    none, selective, full = activation_bytes(layer_ops(GPT, g), g, H)
    return float({"none": none, "selective": selective, "full": full}[recompute])


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_memory_equals_korthikanti_closed_forms(t):
    sbh, quad = S * B * H, 5 * A * S / H
    if t == 1:
        assert activations("none") == pytest.approx(sbh * (34 + quad))
    assert activations("none", tp=t) == pytest.approx(sbh * (10 + 24 / t + quad / t))
    assert activations("selective", tp=t) == pytest.approx(sbh * (10 + 24 / t))
    assert activations("full", tp=t) == pytest.approx(2 * sbh)
    if t > 1:
        assert activations("none", tp=t, sp=True) == pytest.approx(sbh / t * (34 + quad))
        assert activations("selective", tp=t, sp=True) == pytest.approx(34 * sbh / t)
        assert activations("full", tp=t, sp=True) == pytest.approx(2 * sbh / t)


def test_flash_attention_keeps_statistics_instead_of_the_square():
    lse = 4 * A * S * B  # fp32 log-sum-exp per query and head
    assert activations("none", flash=True) == pytest.approx(34 * S * B * H + lse)
    assert activations("selective", flash=True) == activations("none", flash=True)


def test_tp_collectives_per_layer():
    """Without SP: one all-reduce per block each way; with SP: all-gather + reduce-scatter each way."""
    g = Geometry(micro_batch=1, seq=S, tp=8)
    kinds = [(c.kind, d) for op in layer_ops(GPT, g) for d in ("forward", "backward") for c in getattr(op, d).comms
             if c.runs]
    assert sorted(kinds) == sorted([("all-reduce", "forward")] * 2 + [("all-reduce", "backward")] * 2)
    g = Geometry(micro_batch=1, seq=S, tp=8, sequence_parallel=True)
    comms = [c for op in layer_ops(GPT, g) for d in ("forward", "backward") for c in getattr(op, d).comms if c.runs]
    assert sorted(c.kind for c in comms) == ["all-gather"] * 4 + ["reduce-scatter"] * 4
    assert all(c.bytes == S * B * H * 2 and c.size == 8 and c.group == "tp" for c in comms)
