"""`DDPBucketed`: gradients packed into flat buckets under a size cap; each bucket's async all-reduce
starts as soon as its last gradient is ready, overlapping the rest of backward.

The layout comes from `stepscope.spec.buckets.plan_buckets` (reverse registration order, `strict` or
`torch` rule; cap None = one bucket). Buckets launch strictly in index order, as PyTorch's reducer does:
a bucket that completes early waits for the ones before it. That keeps every rank's sequence of
collectives identical even when a parameter gets no gradient on some rank: at
`finish_gradient_synchronization()` the missing gradients are filled with zeros and the remaining
buckets launched in order, so unused parameters neither hang nor corrupt the step.

Costs per step: one pass over every gradient into its bucket (in the hook; without a communication hook
the division by the world size is fused into that copy), one all-reduce per bucket, and no copy back:
`.grad` becomes a view into the reduced bucket. Memory: the buckets (as large as all gradients) persist
across steps; the gradients autograd allocated are released once their views replace them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stepscope.distributed.data_parallel.base import DataParallel
from stepscope.distributed.data_parallel.hooks import GradBucket
from stepscope.spec.buckets import plan_buckets


class DDPBucketed(DataParallel):
    """Bucketed, overlapped gradient all-reduce (see the module docstring)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0, *, rule: str = "strict",
                 process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(module, process_group=process_group)
        by_name = dict(zip(self.parameter_names, self.communicated, strict=True))
        self.bucket_size_mb = bucket_size_mb
        self.plan = plan_buckets([(name, p.numel(), p.dtype) for name, p in by_name.items()], bucket_size_mb, rule)
        self._bucket_params: list[list[nn.Parameter]] = []
        self._bucket_offsets: list[list[int]] = []
        self._bucket_buffers: list[torch.Tensor] = []
        self._slot: dict[int, tuple[int, int]] = {}  # id(parameter) -> (bucket, position in bucket)
        for bucket in self.plan:
            parameters = [by_name[name] for name in bucket.names]
            offsets, total = [], 0
            for position, p in enumerate(parameters):
                self._slot[id(p)] = (bucket.index, position)
                offsets.append(total)
                total += p.numel()
            self._bucket_params.append(parameters)
            self._bucket_offsets.append(offsets)
            self._bucket_buffers.append(torch.zeros(total, dtype=parameters[0].dtype,
                                                    device=parameters[0].device))
        self._reset_step()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.communicated]

    def _reset_step(self) -> None:
        self._ready = [[False] * len(parameters) for parameters in self._bucket_params]
        self._ready_count = [0] * len(self._bucket_params)
        self._next_launch = 0
        self._in_flight: list[tuple[GradBucket, torch.futures.Future]] = []

    # ---- during backward ----------------------------------------------------------------------------
    def _on_gradient_ready(self, parameter: torch.Tensor) -> None:
        if not self._armed:
            return
        index, position = self._slot[id(parameter)]
        if self._ready[index][position]:
            raise RuntimeError(f"parameter {self.plan[index].names[position]!r} received a second gradient "
                               "before finish_gradient_synchronization() (one backward per step)")
        self._pack(index, position, parameter.grad)
        self._launch_ready_buckets()

    def _pack(self, index: int, position: int, grad: torch.Tensor | None) -> None:
        """Copy one gradient (zeros when there is none) into its slice of the bucket buffer."""
        parameter = self._bucket_params[index][position]
        offset = self._bucket_offsets[index][position]
        view = self._bucket_buffers[index][offset:offset + parameter.numel()]
        if grad is None:
            view.zero_()
        elif self._hook is None:
            # the default averaging, fused into the copy: one pass over the gradient instead of two
            torch.div(grad, self.world_size, out=view.view(parameter.shape))
        else:
            view.view(parameter.shape).copy_(grad)
        self._ready[index][position] = True
        self._ready_count[index] += 1

    def _launch_ready_buckets(self) -> None:
        """Launch every complete bucket from the next one in index order (the same order on every rank)."""
        last = len(self._bucket_buffers) - 1
        while (self._next_launch <= last
               and self._ready_count[self._next_launch] == len(self._bucket_params[self._next_launch])):
            index = self._next_launch
            bucket = GradBucket(index, self._bucket_buffers[index], self._bucket_params[index],
                                self._bucket_offsets[index], index == last)
            if self._hook is None:  # already divided while packing: sum only
                work = dist.all_reduce(bucket.buffer(), group=self.process_group, async_op=True)
                future = work.get_future().then(lambda done: done.value()[0])
            else:
                future = self._reduce(bucket)
            self._in_flight.append((bucket, future))
            self._next_launch += 1

    # ---- after backward -----------------------------------------------------------------------------
    def finish_gradient_synchronization(self) -> None:
        for index in range(self._next_launch, len(self._bucket_buffers)):
            for position, parameter in enumerate(self._bucket_params[index]):
                if not self._ready[index][position]:
                    # no hook this step: unused here (zeros), or backward ran without our forward (.grad)
                    self._pack(index, position, parameter.grad)
        self._launch_ready_buckets()
        in_flight = self._in_flight
        self._reset_step()
        self._armed = False
        for bucket, future in in_flight:
            self._finish_future(bucket, future)

    # ---- introspection ------------------------------------------------------------------------------
    def message_numels(self) -> list[int]:
        return [buffer.numel() for buffer in self._bucket_buffers]

    def communication_buffers(self) -> list[torch.Tensor]:
        return list(self._bucket_buffers)

    def remove_hooks(self) -> None:
        """Detach from the module's parameters (the module keeps working unwrapped)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
