"""`DataParallel`: the one interface every data-parallel wrapper implements, and what they share.

- `.module` is the wrapped model; the wrapper adds no parameters and keeps their order.
- Construction broadcasts rank 0's parameters (trainable and frozen) and buffers to every rank.
- `forward` passes through (and arms the gradient hooks of the variants that have them).
- `finish_gradient_synchronization()` completes all gradient communication and leaves AVERAGED gradients
  in `.grad` of every trainable parameter (as views into the reduced buffer, like PyTorch's
  `gradient_as_bucket_view=True`: no copy back); it also resets the per-step state.
- `register_comm_hook(state, hook)`: PyTorch DDP's hook contract (see `hooks.py`); default all-reduce +
  average without one.
- `no_sync()`: PyTorch DDP's context for gradient accumulation: backward passes inside it only accumulate
  local gradients; the first synchronized step after it reduces their sum.

Which parameters are communicated: `module.parameters()` with `requires_grad` (a tied parameter appears
once there although its gradient accumulates from every use, so it is reduced once; frozen parameters are
never communicated and stay equal because they were broadcast). A parameter without a gradient this step
contributes zeros (all ranks still run the same collectives, so nothing waits forever); the
individual-parameter variant cannot do that safely and raises instead.

Hooks armed only between this wrapper's `forward` and `finish_gradient_synchronization()` (PyTorch's
reducer does the same) let several wrappers share one module, which the benchmark uses to interleave
variants on one copy of the weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stepscope.distributed.data_parallel.hooks import CommHook, GradBucket, allreduce_average, future_tensor


def broadcast_module_state(module: nn.Module, process_group: dist.ProcessGroup | None = None) -> None:
    """Copy the group's first rank's parameters and buffers into every rank (in place, no autograd)."""
    source = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.detach(), src=source, group=process_group)


class DataParallel(nn.Module):
    """Base of the data-parallel wrappers; subclasses implement `finish_gradient_synchronization`."""

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("data-parallel wrappers need torch.distributed initialized "
                               "(run through stepscope.distributed.launch.launcher.launch)")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        names = {id(p): name for name, p in module.named_parameters()}
        # the communicated parameters: shared ones once (parameters() dedupes), frozen ones never
        self.communicated = [p for p in module.parameters() if p.requires_grad]
        self.parameter_names = [names[id(p)] for p in self.communicated]
        self._hook: CommHook | None = None
        self._hook_state: Any = None
        self._armed = False
        self._synchronizing = True
        broadcast_module_state(module, process_group)

    # ---- the interface ----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and self._synchronizing:
            self._armed = True
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward inside only accumulate local gradients: no hook is armed, and the caller does not
        call `finish_gradient_synchronization()` for them (the training step does so on the last micro-batch)."""
        previous, self._synchronizing = self._synchronizing, False
        try:
            yield
        finally:
            self._synchronizing = previous

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Reduce every bucket with `hook(state, bucket)` instead of the default all-reduce + average."""
        if self._hook is not None:
            raise RuntimeError("a communication hook is already registered on this wrapper")
        if not callable(hook):
            raise TypeError("hook must be callable as hook(state, bucket)")
        self._hook, self._hook_state = hook, state

    def message_numels(self) -> list[int]:
        """Elements of each all-reduce one step issues, in launch order (for timing communication alone)."""
        raise NotImplementedError

    def communication_buffers(self) -> list[torch.Tensor]:
        """Persistent buffers the wrapper holds for communication (counted as gradient memory)."""
        return []

    # ---- shared machinery -------------------------------------------------------------------------
    def _reduce(self, bucket: GradBucket) -> torch.futures.Future:
        if self._hook is None:
            return allreduce_average(self.process_group, bucket)
        return self._hook(self._hook_state, bucket)

    def _flat_gradient(self, parameter: nn.Parameter) -> torch.Tensor:
        """The parameter's gradient as a flat tensor (its own storage when contiguous; zeros if it has none)."""
        grad = parameter.grad
        if grad is None:
            return torch.zeros(parameter.numel(), dtype=parameter.dtype, device=parameter.device)
        return grad.view(-1) if grad.is_contiguous() else grad.reshape(-1)

    @staticmethod
    def _store_gradients(parameters: list[nn.Parameter], offsets: list[int], result: torch.Tensor) -> None:
        """Make each `.grad` a view into the reduced flat `result` (as PyTorch's gradient_as_bucket_view):
        no copy back, and the local gradient's own storage is released."""
        for p, offset in zip(parameters, offsets, strict=True):
            view = result[offset:offset + p.numel()].view(p.shape)
            if view.dtype == p.dtype:
                p.grad = view
            elif p.grad is None:
                p.grad = view.to(p.dtype)
            else:
                p.grad.copy_(view)  # a hook that returned another dtype: cast into the existing gradient

    def _finish_future(self, bucket: GradBucket, future: torch.futures.Future) -> None:
        result = future_tensor(future)
        if result.numel() != bucket.buffer().numel():
            raise RuntimeError(f"communication hook returned {result.numel()} elements for bucket "
                               f"{bucket.index()} of {bucket.buffer().numel()}")
        self._store_gradients(bucket.parameters(), bucket.offsets(), result)
