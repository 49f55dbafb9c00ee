"""Named model presets: the CS336 sizes, the GPT-2 family, published large models, and `tiny`.

Add a preset by adding one entry to a table below; `get_preset` validates it like any user spec.
"""

from __future__ import annotations

from typing import Any

from stepscope.errors import UsageError
from stepscope.spec.model import ModelSpec

# CS336 assignment sizes: vocab 10000, context 1024, RMSNorm, SwiGLU, RoPE theta 10000, untied, no biases.
_CS336 = dict(vocab_size=10_000, context_length=1024, norm="rms", mlp="swiglu", positions="rope",
              tie_embeddings=False, rope_theta=10_000.0, attn_bias=False, mlp_bias=False)
# GPT-2 (Radford et al. 2019): LayerNorm, biases in every linear layer, GELU MLP 4d, learned positions, tied.
_GPT2 = dict(vocab_size=50_257, context_length=1024, norm="layer", mlp="gelu", positions="learned",
             tie_embeddings=True, attn_bias=True, mlp_bias=True)
# Megatron-LM GPT runs (Narayanan et al. 2021, Table 1): GPT-2 architecture, vocab padded to 51200, seq 2048.
_MEGATRON = dict(_GPT2, vocab_size=51_200, context_length=2048)
# Llama 3 (Dubey et al. 2024): RMSNorm, SwiGLU, RoPE theta 500000, grouped-query attention with 8 KV heads.
_LLAMA3 = dict(vocab_size=128_256, context_length=8192, norm="rms", mlp="swiglu", positions="rope",
               tie_embeddings=False, rope_theta=500_000.0, n_kv_heads=8)
# Llama 2 (Touvron et al. 2023, arXiv 2307.09288; NeMo llama.py Llama2Config7B/13B/70B @8cfedd7203): RMSNorm,
# SwiGLU, RoPE theta 10000, untied, vocab 32000, context 4096; the 70B uses grouped-query attention (8 KV heads).
_LLAMA2 = dict(vocab_size=32_000, context_length=4096, norm="rms", mlp="swiglu", positions="rope",
               tie_embeddings=False, rope_theta=10_000.0)
# Megatron-Core's GPT scaling runs (NVIDIA/Megatron-LM README @f2e5db402c, images/model_table.png): only the shapes
# are published ('All models use a vocabulary size of 131,072 and a sequence length of 4096'); untied embeddings
# (the sizes need them), LayerNorm, GeLU MLP 4d with biases and rotary positions are ASSUMED.
_MCORE = dict(vocab_size=131_072, context_length=4096, norm="layer", mlp="gelu", positions="rope",
              tie_embeddings=False, attn_bias=True, mlp_bias=True)
# MegaScale (Jiang et al. 2024, arXiv 2402.15627) Table 1 and §6.1: 128 heads for the 175B, vocab 64000, seq 2048;
# d_ff 4d and the GPT-3 block ASSUMED (the Megatron-LM baseline's; MegaScale's own parallel block is not modelled).
_MEGASCALE = dict(_GPT2, vocab_size=64_000, context_length=2048)
# MosaicML MPT (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml @5e85bd62d): the GPT-2 block at vocab 50368,
# seq 2048, expansion ratio 4 (the NumParams column of llm-foundry's benchmark table is reproduced exactly).
_MPT = dict(_GPT2, vocab_size=50_368, context_length=2048)
# Mistral's Mixtral (Jiang et al. 2024, arXiv 2401.04088; HF config.json): Llama-like, 8 experts, top-2.
_MIXTRAL = dict(context_length=32_768, norm="rms", mlp="swiglu", positions="rope", tie_embeddings=False,
                rope_theta=1_000_000.0, n_kv_heads=8, n_experts=8, experts_per_token=2)
# Qwen3 MoE (Qwen3 technical report, arXiv 2505.09388; HF config.json of Qwen3-30B-A3B): head_dim 128
# wider than d_model / n_heads, 128 experts of width 768, top-8, no shared expert. Its per-head QK
# RMSNorm (256 weights a block) is not modelled.
_QWEN3_MOE = dict(vocab_size=151_936, context_length=32_768, norm="rms", mlp="swiglu", positions="rope",
                  tie_embeddings=False, rope_theta=1_000_000.0)
# DeepSeek-V3's shapes (DeepSeek-AI 2024, arXiv 2412.19437, §4.2; HF config.json) with grouped-query
# attention standing in for multi-head latent attention (MLA): 128 heads of width 96 with 8 KV heads have
# MLA's 187.2M weights per block (MLA: 187.1M), but their score and value products cost 192 instead of
# MLA's 320 multiply-adds per head and key. The multi-token-prediction module is not counted. Routing is
# group-limited as in the paper (config.json n_group 8, topk_group 4: each token to at most 4 nodes).
_DEEPSEEK_V3_GQA = dict(vocab_size=129_280, context_length=4096, norm="rms", mlp="swiglu", positions="rope",
                        tie_embeddings=False, rope_theta=10_000.0, n_kv_heads=8, head_dim=96,
                        n_experts=256, experts_per_token=8, expert_d_ff=2048, n_shared_experts=1,
                        dense_layers=3, router="sigmoid", expert_groups=8, groups_per_token=4)


def _sized(base: dict[str, Any], d_model: int, n_layers: int, n_heads: int, d_ff: int | None = None,
           **extra: Any) -> dict[str, Any]:
    return dict(base, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                d_ff=4 * d_model if d_ff is None else d_ff, **extra)


PRESETS: dict[str, dict[str, Any]] = {
    # for tests and quick demos: runs a training step in milliseconds
    "tiny": _sized(_CS336, 64, 2, 4, 256, vocab_size=512, context_length=256),
    "small": _sized(_CS336, 768, 12, 12, 3072),
    "medium": _sized(_CS336, 1024, 24, 16, 4096),
    "large": _sized(_CS336, 1280, 36, 20, 5120),
    "xl": _sized(_CS336, 1600, 48, 25, 6400),
    "2.7B": _sized(_CS336, 2560, 32, 32, 10240),
    "gpt2": _sized(_GPT2, 768, 12, 12),
    "gpt2-medium": _sized(_GPT2, 1024, 24, 16),
    "gpt2-large": _sized(_GPT2, 1280, 36, 20),
    "gpt2-xl": _sized(_GPT2, 1600, 48, 25),
    # GPT-3 175B (Brown et al. 2020)
    "gpt3-175b": _sized(_GPT2, 12288, 96, 96, context_length=2048),
    "megatron-1.7b": _sized(_MEGATRON, 2304, 24, 24),
    "megatron-3.6b": _sized(_MEGATRON, 3072, 30, 32),
    "megatron-7.5b": _sized(_MEGATRON, 4096, 36, 32),
    "megatron-18.4b": _sized(_MEGATRON, 6144, 40, 48),
    "megatron-39.1b": _sized(_MEGATRON, 8192, 48, 64),
    "megatron-76.1b": _sized(_MEGATRON, 10240, 60, 80),
    "megatron-145.6b": _sized(_MEGATRON, 12288, 80, 96),
    "megatron-310.1b": _sized(_MEGATRON, 16384, 96, 128),
    "megatron-529.6b": _sized(_MEGATRON, 20480, 105, 128),
    "megatron-1t": _sized(_MEGATRON, 25600, 128, 160),
    # Megatron-Turing NLG 530B (Smith et al. 2022)
    "mt-nlg-530b": _sized(_GPT2, 20480, 105, 128, context_length=2048),
    "llama2-7b": _sized(_LLAMA2, 4096, 32, 32, 11008),
    "llama2-13b": _sized(_LLAMA2, 5120, 40, 40, 13824),
    "llama2-70b": _sized(_LLAMA2, 8192, 80, 64, 28672, n_kv_heads=8),
    "llama3-8b": _sized(_LLAMA3, 4096, 32, 32, 14336),
    "llama3-70b": _sized(_LLAMA3, 8192, 80, 64, 28672),
    "llama3-405b": _sized(_LLAMA3, 16384, 126, 128, 53248),
    "mcore-gpt-1.7b": _sized(_MCORE, 2048, 24, 16),
    "mcore-gpt-7.1b": _sized(_MCORE, 4096, 30, 32),
    "mcore-gpt-16b": _sized(_MCORE, 6144, 32, 48),
    "mcore-gpt-32b": _sized(_MCORE, 7168, 48, 56),
    "mcore-gpt-70b": _sized(_MCORE, 8192, 84, 64),
    "mcore-gpt-119b": _sized(_MCORE, 10240, 92, 80),
    "mcore-gpt-177b": _sized(_MCORE, 12288, 96, 96),
    "mcore-gpt-314b": _sized(_MCORE, 16384, 96, 128),
    "mcore-gpt-462b": _sized(_MCORE, 18432, 112, 144),
    "megascale-175b": _sized(_MEGASCALE, 12288, 96, 128),
    "megascale-530b": _sized(_MEGASCALE, 20480, 105, 160),
    "mpt-3b": _sized(_MPT, 2560, 32, 20),
    "mpt-7b": _sized(_MPT, 4096, 32, 32),
    "mpt-13b": _sized(_MPT, 5120, 40, 40),
    "mpt-30b": _sized(_MPT, 7168, 48, 56),
    "mpt-70b": _sized(_MPT, 8192, 80, 64),
    # Mixture-of-Experts: for tests, one dense block then two MoE blocks with a shared expert
    "tiny-moe": _sized(_CS336, 64, 3, 4, 256, vocab_size=512, context_length=256, n_experts=4,
                       experts_per_token=2, expert_d_ff=128, n_shared_experts=1, dense_layers=1),
    "mixtral-8x7b": _sized(_MIXTRAL, 4096, 32, 32, 14336, vocab_size=32_000),
    "mixtral-8x22b": _sized(_MIXTRAL, 6144, 56, 48, 16384, vocab_size=32_768, context_length=65_536),
    "qwen3-30b-a3b": _sized(_QWEN3_MOE, 2048, 48, 32, 6144, n_kv_heads=4, head_dim=128, n_experts=128,
                            experts_per_token=8, expert_d_ff=768),
    # Qwen3-235B-A22B (NeMo qwen3.py Qwen3Config235B_A22B @8cfedd7203 = HF config.json): 94 layers, 4 KV heads,
    # 128 experts of width 1536, top-8, no shared expert, context 40960
    "qwen3-235b-a22b": _sized(_QWEN3_MOE, 4096, 94, 64, 12288, context_length=40_960, n_kv_heads=4, head_dim=128,
                              n_experts=128, experts_per_token=8, expert_d_ff=1536),
    "deepseek-v3-gqa": _sized(_DEEPSEEK_V3_GQA, 7168, 61, 128, 18432),
    # MegaScale-MoE (Jin et al., EuroSys'26, doi 10.1145/3767295.3769325) Table 2 'Internal-352B' and §6.1: 60 layers,
    # h 4096, 32 heads with m=4 query heads per KV head (8 KV heads), h_ffn 14336, 32 experts top-3, vocab 65536,
    # seq 8192. ONE SHARED EXPERT of width 14336 is INFERRED, not stated: without it the shapes give 341.3B, not
    # the paper's 352B, and with it (and causal attention) the paper's MFU column (32.48% .. 27.89%) is reproduced.
    "megascale-moe-352b": _sized(dict(vocab_size=65_536, context_length=8192, norm="rms", mlp="swiglu",
                                      positions="rope", tie_embeddings=False), 4096, 60, 32, 14336, n_kv_heads=8,
                                 n_experts=32, experts_per_token=3, n_shared_experts=1),
}


def list_presets() -> list[str]:
    """Preset names in table order."""
    return list(PRESETS)


def get_preset(name: str, **overrides: Any) -> ModelSpec:
    """The preset `name` with optional field overrides, e.g. `get_preset("small", n_layers=2)`."""
    if name not in PRESETS:
        raise UsageError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    spec = ModelSpec(name=name, **PRESETS[name])
    return spec.replace(**overrides) if overrides else spec
