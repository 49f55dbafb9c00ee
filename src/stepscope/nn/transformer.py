"""`TransformerLM`: a pre-norm decoder-only language model built from a `ModelSpec`.

One file, read top to bottom: norms, rotary positions, attention, MLP, block, model. The Mixture-of-Experts
block that replaces the MLP after `spec.dense_layers` blocks lives in `nn.moe`. Both families
(CS336/Llama: RMSNorm + SwiGLU + RoPE; GPT-2: LayerNorm + GELU + learned positions + biases + tied
embeddings) come from the same classes. Parameters are registered embeddings first, then blocks,
then the final norm, matching GPT-2's order so DDP bucket layouts match PyTorch's published ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stepscope.nn.attention import get_attention
from stepscope.nn.moe import MOE_IMPLS, MoE, RoutedExperts, check_impl
from stepscope.spec import ModelSpec


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 for stability and cast back."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rms":
        return RMSNorm(spec.d_model, spec.norm_eps)
    return nn.LayerNorm(spec.d_model, eps=spec.norm_eps)


class Rotary(nn.Module):
    """Rotary position embedding (RoPE), applied to pairs of adjacent features of q and k."""

    def __init__(self, head_dim: int, context_length: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float64), inv_freq)
        # buffers, not parameters: they follow .to(device) but are not trained or saved
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, heads, seq, head_dim)."""
        seq = x.shape[-2]
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2)


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads; the score computation is a pluggable backend."""

    def __init__(self, spec: ModelSpec, attention: str) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        # one fused projection for q, k and v: one GEMM instead of three
        self.qkv = nn.Linear(spec.d_model, spec.q_dim + 2 * spec.kv_dim, bias=spec.attn_bias)
        self.out = nn.Linear(spec.q_dim, spec.d_model, bias=spec.attn_bias)
        self.rotary = (Rotary(spec.head_dim, spec.context_length, spec.rope_theta)
                       if spec.positions == "rope" else None)
        self.attend = get_attention(attention)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim,
                                     self.n_kv_heads * self.head_dim], dim=-1)
        q = q.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if self.n_kv_heads != self.n_heads:
            group = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = self.attend(q, k, v, True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU (silu(x W_gate) * x W_up) W_down, or GELU (gelu(x W_up)) W_down."""

    def __init__(self, spec: ModelSpec, d_ff: int | None = None) -> None:
        super().__init__()
        self.gated = spec.mlp == "swiglu"
        d_ff = spec.d_ff if d_ff is None else d_ff  # a shared expert is an MLP of width expert_d_ff
        # SwiGLU's gate and up projections are fused into one GEMM
        self.up = nn.Linear(spec.d_model, (2 if self.gated else 1) * d_ff, bias=spec.mlp_bias)
        self.down = nn.Linear(d_ff, spec.d_model, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.down(h)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)); `mlp` is an `MoE` in MoE blocks."""

    def __init__(self, spec: ModelSpec, attention: str, moe_impl: str | None = None) -> None:
        super().__init__()
        self.norm1 = make_norm(spec)
        self.attn = Attention(spec, attention)
        self.norm2 = make_norm(spec)
        self.mlp = MLP(spec) if moe_impl is None else MoE(spec, moe_impl, shared=MLP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Decoder-only language model: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, spec: ModelSpec, attention: str = "sdpa", moe_impl: str = MOE_IMPLS[0]) -> None:
        super().__init__()
        check_impl(moe_impl)
        self.spec = spec
        self.tok_emb = nn.Embedding(spec.vocab_size, spec.d_model)
        self.pos_emb = nn.Embedding(spec.context_length, spec.d_model) if spec.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(spec, attention, moe_impl if spec.is_moe and i >= spec.dense_layers else None)
                                    for i in range(spec.n_layers))
        self.norm_f = make_norm(spec)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 style init: N(0, 0.02) weights, zero biases, unit norms; on the meta device a no-op."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RoutedExperts):
                module.reset_parameters(std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.spec.context_length:
            raise ValueError(f"sequence of {seq} tokens exceeds context_length {self.spec.context_length}")
        x = self.tok_emb(tokens)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:seq]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))

    @property
    def aux_loss(self) -> torch.Tensor | None:
        """The MoE blocks' load-balancing losses of the last forward, summed (None for a dense model)."""
        losses = [block.mlp.aux_loss for block in self.blocks if isinstance(block.mlp, MoE)]
        return torch.stack([loss for loss in losses if loss is not None]).sum() if losses else None

    def set_moe_impl(self, impl: str) -> None:
        """Switch every MoE block to another expert implementation (parameters are unchanged)."""
        check_impl(impl)
        for block in self.blocks:
            if isinstance(block.mlp, MoE):
                block.mlp.experts.impl = impl

    def set_attention(self, attention: str) -> None:
        """Switch every block to another attention backend (parameters are unchanged)."""
        fn = get_attention(attention)
        for block in self.blocks:
            block.attn.attend = fn


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (batch, seq, vocab), targets (batch, seq)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
