"""The measured model: `TransformerLM` (built from the same `ModelSpec` the performance model reads) and the one
attention-backend registry. May import: errors, spec; the kernels register their backends here."""

from stepscope.nn.attention import attention_backends, get_attention, register_attention, unsupported_reason
from stepscope.nn.moe import AUX_LOSS_COEF, MOE_IMPLS
from stepscope.nn.transformer import TransformerLM, lm_loss

__all__ = ["TransformerLM", "lm_loss", "AUX_LOSS_COEF", "MOE_IMPLS", "attention_backends", "get_attention",
           "register_attention", "unsupported_reason"]
