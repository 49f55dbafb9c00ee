"""`ModelSpec`: the hyper-parameters of a decoder-only transformer and its closed forms.

Pure Python (no torch): the same spec builds `stepscope.nn.TransformerLM` and drives the performance
model, so a parameter or FLOP count computed here is exactly what the measured model contains.

FLOP convention (used everywhere in stepscope):
- A matrix multiply of (m x k) by (k x n) costs 2·m·k·n FLOPs; elementwise work, norms, softmax,
  embedding lookups and biases are not counted ("model FLOPs", as in MFU).
- `matmul_params` N counts the weights that take part in matrix multiplies: every linear layer of every
  block plus the output projection to the vocabulary (tied or not). One token's forward pass costs 2N.
- Attention adds, per layer and token, 2·s·d for the scores (Q·Kᵀ) and 2·s·d for the value product
  (P·V) with s keys and d = d_model, i.e. 4·s·d; a causal mask halves it (the FlashAttention convention).
- Backward costs twice the forward, so training (forward + backward) costs 3x forward:
  6N + 12·L·s·d per token, or 6N + 6·L·s·d when causal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from stepscope.errors import UsageError

Norm = Literal["rms", "layer"]
Mlp = Literal["swiglu", "gelu"]
Positions = Literal["rope", "learned"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("rms", "layer"),
    "mlp": ("swiglu", "gelu"),
    "positions": ("rope", "learned"),
}


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer (GPT-2 and Llama families and the CS336 sizes)."""

    vocab_size: int
    """Number of token ids (rows of the embedding table)."""
    context_length: int
    """Longest sequence the model accepts (rows of a learned position table)."""
    d_model: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Query heads per attention layer; head dimension is d_model / n_heads."""
    d_ff: int
    """Hidden width of the MLP (per branch for SwiGLU)."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None means n_heads (plain multi-head attention)."""
    norm: Norm = "rms"
    """`rms` (RMSNorm, weight only) or `layer` (LayerNorm, weight and bias)."""
    mlp: Mlp = "swiglu"
    """`swiglu` (three matrices, SiLU gate) or `gelu` (two matrices)."""
    positions: Positions = "rope"
    """`rope` (rotary, no parameters) or `learned` (a context_length x d_model table)."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies (ignored with learned positions)."""
    attn_bias: bool = False
    """Biases on the QKV and output projections."""
    mlp_bias: bool = False
    """Biases on the MLP projections."""
    norm_eps: float = 1e-5
    """Epsilon of every normalization layer."""
    name: str = field(default="custom", compare=False)
    """Preset name this spec came from (informational; not part of equality)."""

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff", "n_kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise UsageError(f"{name} must be one of {'|'.join(choices)}, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise UsageError(f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise UsageError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if self.positions == "rope" and self.head_dim % 2:
            raise UsageError(f"rotary positions need an even head dimension, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise UsageError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.norm_eps > 0:
            raise UsageError(f"norm_eps must be positive, got {self.norm_eps!r}")

    # ---- shapes -----------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Width of one attention head: d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output: n_kv_heads x head_dim."""
        return self.n_kv_heads * self.head_dim  # type: ignore[operator]

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UsageError(f"unknown model field {unknown[0]!r}; fields: {', '.join(field_names())}")
        if "n_heads" in changes and "n_kv_heads" not in changes and self.n_kv_heads == self.n_heads:
            changes["n_kv_heads"] = None  # plain MHA stays plain MHA when the head count changes
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field (the `model_spec` of a record)."""
        return dataclasses.asdict(self)

    # ---- parameter counts (exact, matching stepscope.nn.TransformerLM) -------------------------
    def norm_params(self) -> int:
        """One normalization layer: weight (RMSNorm) or weight and bias (LayerNorm)."""
        return 2 * self.d_model if self.norm == "layer" else self.d_model

    def attention_params(self) -> int:
        """QKV projection plus output projection of one block."""
        d = self.d_model
        qkv = d * (d + 2 * self.kv_dim) + (d + 2 * self.kv_dim if self.attn_bias else 0)
        out = d * d + (d if self.attn_bias else 0)
        return qkv + out

    def mlp_params(self) -> int:
        """MLP of one block: SwiGLU has gate, up and down matrices; GELU has up and down."""
        d, f = self.d_model, self.d_ff
        if self.mlp == "swiglu":
            return 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
        return 2 * d * f + ((f + d) if self.mlp_bias else 0)

    def block_params(self) -> int:
        """One transformer block: two norms, attention, MLP."""
        return 2 * self.norm_params() + self.attention_params() + self.mlp_params()

    def embedding_params(self) -> int:
        """Token embedding, learned positions, and the output projection when it is not tied."""
        n = self.vocab_size * self.d_model
        if self.positions == "learned":
            n += self.context_length * self.d_model
        if not self.tie_embeddings:
            n += self.vocab_size * self.d_model
        return n

    def param_count(self) -> int:
        """Exact number of trainable parameters (tied weights counted once)."""
        return self.embedding_params() + self.n_layers * self.block_params() + self.norm_params()

    def matmul_params(self) -> int:
        """Weights used in matrix multiplies: all block linear weights plus the vocabulary projection."""
        d = self.d_model
        attention = d * (d + 2 * self.kv_dim) + d * d
        mlp = (3 if self.mlp == "swiglu" else 2) * d * self.d_ff
        return self.n_layers * (attention + mlp) + self.vocab_size * d

    # ---- FLOPs (see the module docstring for the convention) ---------------------------------
    def attention_flops_per_token(self, seq: int, causal: bool = True) -> float:
        """Forward FLOPs of Q·Kᵀ and P·V for one token over all layers."""
        flops = 4.0 * self.n_layers * seq * self.d_model
        return flops / 2 if causal else flops

    def forward_flops_per_token(self, seq: int, causal: bool = True) -> float:
        """Forward FLOPs per token: 2N + the attention term."""
        return 2.0 * self.matmul_params() + self.attention_flops_per_token(seq, causal)

    def flops_per_token(self, seq: int, causal: bool = True) -> float:
        """Training (forward + backward) FLOPs per token: 6N + 3 x the attention term."""
        return 3.0 * self.forward_flops_per_token(seq, causal)

    # ---- bytes ---------------------------------------------------------------------------------
    def param_bytes(self, precision: str = "fp32") -> int:
        """Bytes to store the parameters once in the given precision."""
        from stepscope.spec.workload import bytes_per_element

        return self.param_count() * bytes_per_element(precision)

    def describe(self) -> str:
        """One line: name, size and architecture."""
        kv = f", kv_heads {self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        return (
            f"{self.name}: {self.param_count() / 1e6:,.1f}M params, d_model {self.d_model}, "
            f"{self.n_layers} layers, {self.n_heads} heads{kv}, d_ff {self.d_ff}, {self.norm}norm, "
            f"{self.mlp}, {self.positions} positions, vocab {self.vocab_size}"
        )


def field_names() -> list[str]:
    """Names of the ModelSpec fields a user may override (everything but `name`)."""
    return [f.name for f in dataclasses.fields(ModelSpec) if f.name != "name"]


def field_choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a string field (norm, mlp, positions), None for free-valued fields."""
    return _CHOICES.get(name)
