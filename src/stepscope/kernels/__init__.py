"""Attention kernels: FlashAttention-2 in tiled PyTorch and in Triton, each beside the naive reference.

`FlashAttentionTorch` (stepscope.kernels.flash_torch) and `FlashAttentionTriton`
(stepscope.kernels.flash_triton) are loaded on first access, so `import stepscope.kernels` imports
neither torch's kernels nor triton. Importing either module registers its attention backend
(`flash-torch`, `flash-triton`) in `stepscope.nn.attention`. May import: errors, nn.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"FlashAttentionTorch": "stepscope.kernels.flash_torch",
         "FlashAttentionTriton": "stepscope.kernels.flash_triton"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
