"""The communication-hook contract shared with PyTorch DDP: `GradBucket` and the default all-reduce hook.

A hook is `hook(state, bucket) -> torch.futures.Future[torch.Tensor]`. `bucket` offers the methods of
`torch.distributed.GradBucket` (`index()`, `buffer()`, `is_last()`, `parameters()`, `gradients()`,
`set_buffer()`); the future's value is the REDUCED AND AVERAGED flat gradient, shaped like `buffer()`
(it may be `buffer()` itself, reduced in place, or a new tensor, e.g. after decompression). The same
function can be registered on `torch.nn.parallel.DistributedDataParallel` and on our wrappers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

CommHook = Callable[[Any, "GradBucket"], torch.futures.Future]


class GradBucket:
    """What a hook receives: a flat gradient buffer and the parameters laid out in it (in order)."""

    def __init__(self, index: int, buffer: torch.Tensor, parameters: list[torch.nn.Parameter],
                 offsets: list[int], is_last: bool) -> None:
        self._index, self._buffer, self._parameters = index, buffer, parameters
        self._offsets, self._is_last = offsets, is_last

    def index(self) -> int:
        """Position of this bucket in the step's launch order (0 is launched first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient buffer (local, not yet reduced)."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the buffer (as `torch.distributed.GradBucket.set_buffer`)."""
        self._buffer = buffer

    def is_last(self) -> bool:
        """True for the last bucket launched in the step."""
        return self._is_last

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients the buffer holds, in buffer order."""
        return list(self._parameters)

    def offsets(self) -> list[int]:
        """Where each parameter's gradient starts in `buffer()` (stepscope addition)."""
        return list(self._offsets)

    def gradients(self) -> list[torch.Tensor]:
        """Views into `buffer()`, one per parameter, shaped like the parameter."""
        return [self._buffer[offset:offset + p.numel()].view(p.shape)
                for p, offset in zip(self._parameters, self._offsets, strict=True)]


def allreduce_average(process_group: dist.ProcessGroup | None, bucket: GradBucket) -> torch.futures.Future:
    """The default hook (PyTorch's `allreduce_hook`): divide by the world size, then sum across ranks.
    Dividing first keeps fp16 sums from overflowing; `state` is the process group (None = WORLD)."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def future_tensor(future: torch.futures.Future) -> torch.Tensor:
    """Wait for a hook's future; its value must be a tensor (a one-element list is accepted too)."""
    value = future.wait()
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"a communication hook's future must hold a tensor, got {type(value).__name__}")
    return value
