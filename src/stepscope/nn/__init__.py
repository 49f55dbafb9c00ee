"""The measured model: `TransformerLM` and the attention-backend registry."""

from stepscope.nn.attention import attention_backends, get_attention, register_attention
from stepscope.nn.transformer import TransformerLM, lm_loss

__all__ = ["TransformerLM", "lm_loss", "attention_backends", "get_attention", "register_attention"]
