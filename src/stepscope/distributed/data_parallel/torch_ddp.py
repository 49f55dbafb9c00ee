"""PyTorch's own `DistributedDataParallel`, built the way stepscope compares against it (the `ddp` benchmark's
`torch` variant, `innet train`): bucket cap as given and no buffer broadcast at every forward. Our wrappers
broadcast buffers once, at construction; a per-forward broadcast would also make fast ranks wait for a
straggler.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn


@functools.lru_cache(maxsize=1)
def _no_forward_buffer_sync() -> dict[str, bool]:
    # torch >= 2.13 names the option forward_sync_buffers and deprecates broadcast_buffers; older releases
    # (stepscope supports torch >= 2.3) only know broadcast_buffers
    options = inspect.signature(nn.parallel.DistributedDataParallel).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in options else {"broadcast_buffers": False}


def torch_ddp(module: nn.Module, bucket_cap_mb: float) -> nn.parallel.DistributedDataParallel:
    """`DistributedDataParallel(module, bucket_cap_mb=...)` without the per-forward buffer broadcast."""
    return nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb, **_no_forward_buffer_sync())
