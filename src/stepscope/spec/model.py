"""`ModelSpec`: the hyper-parameters of a decoder-only transformer and its closed forms.

Pure Python (no torch): the same spec builds `stepscope.nn.TransformerLM` and drives the performance
model, so a parameter or FLOP count computed here is exactly what the measured model contains.

FLOP convention (used everywhere in stepscope):
- A matrix multiply of (m x k) by (k x n) costs 2·m·k·n FLOPs; elementwise work, norms, softmax,
  embedding lookups and biases are not counted ("model FLOPs", as in MFU).
- `matmul_params` N counts the weights that take part in matrix multiplies: every linear layer of every
  block plus the output projection to the vocabulary (tied or not). One token's forward pass costs 2N.
- Attention adds, per layer and token, 2·s·a for the scores (Q·Kᵀ) and 2·s·a for the value product
  (P·V) with s keys and a = n_heads x head_dim (= d_model unless head_dim is set), i.e. 4·s·a; a causal
  mask halves it (the FlashAttention convention).
- Backward costs twice the forward, so training (forward + backward) costs 3x forward:
  6N + 12·L·s·a per token, or 6N + 6·L·s·a when causal.
- Mixture-of-Experts (the convention of MoE papers): N counts only the *activated* weights, i.e. the
  router and the top-k routed experts plus the shared experts of each MoE layer; the other experts cost
  nothing for that token. `param_count` still counts every expert.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from stepscope.errors import UsageError

MAX_CAPACITY_FACTOR = 1000.0
"""Largest capacity factor accepted: from n_experts / top-k up (32 for DeepSeek-V3) no token is ever dropped,
and a finite bound keeps every capacity a machine integer."""

Norm = Literal["rms", "layer"]
Mlp = Literal["swiglu", "gelu"]
Positions = Literal["rope", "learned"]
Router = Literal["softmax", "sigmoid"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("rms", "layer"),
    "mlp": ("swiglu", "gelu"),
    "positions": ("rope", "learned"),
    "router": ("softmax", "sigmoid"),
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: dense (GPT-2, Llama, the CS336 sizes) or Mixture-of-Experts."""

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
    head_dim: int | None = None
    """Width of one attention head; None means d_model / n_heads (Qwen3 sets it wider than that)."""
    n_experts: int = 0
    """Routed experts per MoE layer; 0 makes a dense model (every other MoE field is then ignored)."""
    experts_per_token: int = 2
    """Routed experts each token goes to (top-k)."""
    expert_d_ff: int | None = None
    """Hidden width of one expert's MLP; None means d_ff."""
    n_shared_experts: int = 0
    """Experts every token goes to besides its routed ones (DeepSeek-V3 has one), each expert_d_ff wide."""
    dense_layers: int = 0
    """Leading blocks that keep a dense d_ff MLP (DeepSeek-V3 keeps 3); the rest are MoE blocks."""
    capacity_factor: float = 0.0
    """Tokens an expert takes, as a multiple of its fair share (tokens x k / experts); 0 is dropless."""
    router: Router = "softmax"
    """`softmax` top-k (Mixtral, Qwen3) or `sigmoid` scores with a load-balancing bias (DeepSeek-V3)."""
    expert_groups: int = 0
    """Group-limited routing: the routed experts form this many equal groups and a token's top-k come from its
    best `groups_per_token` groups (DeepSeek-V3: 8 groups, 4 per token, so that 'each token will be sent to
    at most 4 nodes' when a group sits on one node); 0: no limit."""
    groups_per_token: int = 0
    """Groups a token's experts may come from under group-limited routing."""
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
        if self.head_dim is None:  # an explicit head_dim frees the heads from dividing d_model
            if self.d_model % self.n_heads:
                raise UsageError(f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.expert_d_ff is None:
            object.__setattr__(self, "expert_d_ff", self.d_ff)
        for name in ("head_dim", "expert_d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise UsageError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if self.positions == "rope" and self.head_dim % 2:
            raise UsageError(f"rotary positions need an even head dimension, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise UsageError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.norm_eps > 0:
            raise UsageError(f"norm_eps must be positive, got {self.norm_eps!r}")
        self._check_experts()

    def _check_experts(self) -> None:
        for name in ("n_experts", "n_shared_experts", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{name} must be a non-negative integer, got {value!r}")
        if not self.is_moe:
            return
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise UsageError(f"experts_per_token must be in 1..n_experts={self.n_experts}, "
                             f"got {self.experts_per_token!r}")
        if self.dense_layers >= self.n_layers:
            raise UsageError(f"dense_layers={self.dense_layers} leaves no MoE block of {self.n_layers}")
        if not (self.capacity_factor == 0 or 1 <= self.capacity_factor <= MAX_CAPACITY_FACTOR):
            raise UsageError(f"capacity_factor must be 0 (dropless) or between 1 and {MAX_CAPACITY_FACTOR:g}, "
                             f"got {self.capacity_factor!r}")
        self._check_groups()

    def _check_groups(self) -> None:
        groups, per_token = self.expert_groups, self.groups_per_token
        for name in ("expert_groups", "groups_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{name} must be a non-negative integer, got {value!r}")
        if not groups:
            if per_token:
                raise UsageError("groups_per_token needs expert_groups")
            return
        if self.n_experts % groups:
            raise UsageError(f"expert_groups={groups} does not divide n_experts={self.n_experts}")
        if not 1 <= per_token <= groups:
            raise UsageError(f"groups_per_token must be in 1..expert_groups={groups}, got {per_token!r}")
        if self.experts_per_token > per_token * (self.n_experts // groups):
            raise UsageError(f"experts_per_token={self.experts_per_token} exceeds the experts of "
                             f"{per_token} groups of {self.n_experts // groups}")

    # ---- shapes -----------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the Q projection output (and the attention output): n_heads x head_dim."""
        return self.n_heads * self.head_dim  # type: ignore[operator]

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
        # derived widths follow the fields they came from unless set explicitly
        if ({"n_heads", "d_model"} & set(changes) and "head_dim" not in changes
                and self.head_dim * self.n_heads == self.d_model):  # type: ignore[operator]
            changes["head_dim"] = None
        if "d_ff" in changes and "expert_d_ff" not in changes and self.expert_d_ff == self.d_ff:
            changes["expert_d_ff"] = None
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
        d, q = self.d_model, self.q_dim
        qkv = d * (q + 2 * self.kv_dim) + (q + 2 * self.kv_dim if self.attn_bias else 0)
        out = q * d + (d if self.attn_bias else 0)
        return qkv + out

    def mlp_params(self, d_ff: int | None = None) -> int:
        """One MLP (dense, or one expert with d_ff=expert_d_ff): SwiGLU has gate, up and down
        matrices; GELU has up and down."""
        d, f = self.d_model, self.d_ff if d_ff is None else d_ff
        if self.mlp == "swiglu":
            return 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
        return 2 * d * f + ((f + d) if self.mlp_bias else 0)

    def block_params(self) -> int:
        """One dense transformer block: two norms, attention, MLP."""
        return 2 * self.norm_params() + self.attention_params() + self.mlp_params()

    # ---- Mixture-of-Experts ----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        """True when the blocks after `dense_layers` route tokens to experts."""
        return self.n_experts > 0

    @property
    def moe_layers(self) -> int:
        """Number of MoE blocks (0 for a dense model)."""
        return self.n_layers - self.dense_layers if self.is_moe else 0

    def expert_params(self) -> int:
        """One expert (routed or shared): an MLP of width expert_d_ff."""
        return self.mlp_params(self.expert_d_ff)

    def router_params(self) -> int:
        """The router's d_model x n_experts scores (DeepSeek-V3's balancing bias is a buffer, not trained)."""
        return self.d_model * self.n_experts

    def moe_block_params(self) -> int:
        """One MoE block: two norms, attention, router, every routed and shared expert."""
        experts = (self.n_experts + self.n_shared_experts) * self.expert_params()
        return 2 * self.norm_params() + self.attention_params() + self.router_params() + experts

    def activated_block_params(self) -> int:
        """What one token uses of an MoE block: the router, its top-k experts and the shared ones."""
        experts = (self.experts_per_token + self.n_shared_experts) * self.expert_params()
        return 2 * self.norm_params() + self.attention_params() + self.router_params() + experts

    def embedding_params(self) -> int:
        """Token embedding, learned positions, and the output projection when it is not tied."""
        n = self.vocab_size * self.d_model
        if self.positions == "learned":
            n += self.context_length * self.d_model
        if not self.tie_embeddings:
            n += self.vocab_size * self.d_model
        return n

    def param_count(self) -> int:
        """Exact number of trainable parameters (tied weights counted once; every expert counted)."""
        dense = self.n_layers - self.moe_layers
        blocks = dense * self.block_params() + self.moe_layers * self.moe_block_params()
        return self.embedding_params() + blocks + self.norm_params()

    def activated_param_count(self) -> int:
        """Parameters one token uses: param_count with only its top-k routed experts (MoE papers'
        "activated parameters"); equals param_count for a dense model."""
        dense = self.n_layers - self.moe_layers
        blocks = dense * self.block_params() + self.moe_layers * self.activated_block_params()
        return self.embedding_params() + blocks + self.norm_params()

    def matmul_params(self) -> int:
        """Weights one token multiplies by: the block linear weights (for MoE blocks the router, its
        top-k experts and the shared ones) plus the vocabulary projection."""
        d = self.d_model
        attention = d * (self.q_dim + 2 * self.kv_dim) + self.q_dim * d
        matrices = 3 if self.mlp == "swiglu" else 2
        dense_mlp = matrices * d * self.d_ff
        moe_mlp = (self.n_experts * d
                   + (self.experts_per_token + self.n_shared_experts) * matrices * d * self.expert_d_ff)
        dense = self.n_layers - self.moe_layers
        return (dense * (attention + dense_mlp) + self.moe_layers * (attention + moe_mlp)
                + self.vocab_size * d)

    # ---- FLOPs (see the module docstring for the convention) ---------------------------------
    def attention_flops_per_token(self, seq: int, causal: bool = True) -> float:
        """Forward FLOPs of Q·Kᵀ and P·V for one token over all layers."""
        flops = 4.0 * self.n_layers * seq * self.q_dim
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
        if self.head_dim * self.n_heads != self.d_model:  # type: ignore[operator]
            kv += f", head_dim {self.head_dim}"
        moe = ""
        if self.is_moe:
            shared = f" + {self.n_shared_experts} shared" if self.n_shared_experts else ""
            moe = (f", {self.activated_param_count() / 1e6:,.1f}M activated, {self.n_experts} experts "
                   f"top-{self.experts_per_token}{shared} (d_ff {self.expert_d_ff}) in {self.moe_layers} blocks")
        return (
            f"{self.name}: {self.param_count() / 1e6:,.1f}M params{moe}, d_model {self.d_model}, "
            f"{self.n_layers} layers, {self.n_heads} heads{kv}, d_ff {self.d_ff}, {self.norm}norm, "
            f"{self.mlp}, {self.positions} positions, vocab {self.vocab_size}"
        )


def field_names() -> list[str]:
    """Names of the ModelSpec fields a user may override (everything but `name`)."""
    return [f.name for f in dataclasses.fields(ModelSpec) if f.name != "name"]


def field_choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a string field (norm, mlp, positions), None for free-valued fields."""
    return _CHOICES.get(name)
