"""The two reference variants that communicate only after backward: `DDPNaive` and `DDPFlat`.

Nothing overlaps with compute here, which makes them the baselines the overlapping variants must beat:
- naive: one blocking all-reduce per parameter, so per-call latency is paid ~once per tensor;
- flat: all gradients copied into one persistent buffer (per dtype), one all-reduce: one latency, but one
  extra pass over every gradient and a buffer as large as all gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stepscope.distributed.data_parallel.base import DataParallel
from stepscope.distributed.data_parallel.hooks import GradBucket


class DDPNaive(DataParallel):
    """After backward, one blocking all-reduce per parameter (in the order gradients became ready)."""

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(module, process_group=process_group)
        self._order = list(reversed(self.communicated))  # gradient-ready order for a forward-ordered model

    def finish_gradient_synchronization(self) -> None:
        last = len(self._order) - 1
        for index, parameter in enumerate(self._order):
            bucket = GradBucket(index, self._flat_gradient(parameter), [parameter], [0], index == last)
            self._finish_future(bucket, self._reduce(bucket))  # wait before the next one: blocking
        self._armed = False

    def message_numels(self) -> list[int]:
        return [p.numel() for p in self._order]


class DDPFlat(DataParallel):
    """After backward, every gradient copied into one flat buffer per dtype and all-reduced at once."""

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(module, process_group=process_group)
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for parameter in reversed(self.communicated):
            by_dtype.setdefault(parameter.dtype, []).append(parameter)
        self._groups = list(by_dtype.values())
        self._offsets = [self._layout(group) for group in self._groups]
        # allocated once: a fresh gradient-sized buffer every step would page-fault all of it in again
        self._flat = [torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
                      for group in self._groups]

    @staticmethod
    def _layout(parameters: list[nn.Parameter]) -> list[int]:
        offsets, total = [], 0
        for p in parameters:
            offsets.append(total)
            total += p.numel()
        return offsets

    def finish_gradient_synchronization(self) -> None:
        last = len(self._groups) - 1
        for index, (parameters, offsets, flat) in enumerate(zip(self._groups, self._offsets, self._flat, strict=True)):
            for p, offset in zip(parameters, offsets, strict=True):
                view = flat[offset:offset + p.numel()].view(p.shape)
                if p.grad is None:
                    view.zero_()  # no gradient this step: contributes zeros
                elif p.grad.data_ptr() != view.data_ptr():  # still a view from last step: already in place
                    view.copy_(p.grad)
            bucket = GradBucket(index, flat, parameters, offsets, index == last)
            self._finish_future(bucket, self._reduce(bucket))
        self._armed = False

    def message_numels(self) -> list[int]:
        return [flat.numel() for flat in self._flat]

    def communication_buffers(self) -> list[torch.Tensor]:
        return list(self._flat)
