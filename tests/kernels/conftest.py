"""Kernel tests run the Triton kernels under Triton's interpreter when no GPU is present.

TRITON_INTERPRET must be set before `stepscope.kernels.flash_triton` is first imported (the kernels
are built for the interpreter at import); test modules import it inside their tests, never at
collection time, so this setting (made when pytest loads this file) is always in place first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
