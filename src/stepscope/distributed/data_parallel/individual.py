"""`DDPIndividualParameters`: an async all-reduce per parameter, launched the moment its gradient is ready.

A post-accumulate-grad hook fires once per parameter per backward, after every contribution has been
summed into `.grad` (so a tied parameter fires once, with its full gradient), and launches the
all-reduce on the gradient's own storage while backward goes on. No copies, maximal overlap, but one
per-call latency per tensor.

Launch order is the order hooks fire, which is the same on every rank only if every rank runs the same
graph. A trainable parameter without a gradient in a step therefore cannot be patched up afterwards
(the ranks' collective sequences may already differ): `finish_gradient_synchronization` raises naming it;
use `DDPBucketed`, whose fixed launch order tolerates unused parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stepscope.distributed.data_parallel.base import DataParallel
from stepscope.distributed.data_parallel.hooks import GradBucket


class DDPIndividualParameters(DataParallel):
    """One asynchronous all-reduce per parameter, started from its post-accumulate-grad hook."""

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(module, process_group=process_group)
        self._pending: list[tuple[GradBucket, torch.futures.Future]] = []
        self._launched: set[int] = set()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_gradient_ready) for p in self.communicated]

    def _on_gradient_ready(self, parameter: torch.Tensor) -> None:
        if not self._armed:
            return
        if id(parameter) in self._launched:
            raise RuntimeError(f"parameter {self._name_of(parameter)!r} received a second gradient before "
                               "finish_gradient_synchronization() (one backward per step)")
        self._launched.add(id(parameter))
        index = len(self._pending)
        bucket = GradBucket(index, self._flat_gradient(parameter), [parameter], [0],
                            index == len(self.communicated) - 1)
        self._pending.append((bucket, self._reduce(bucket)))

    def finish_gradient_synchronization(self) -> None:
        missing = [name for name, p in zip(self.parameter_names, self.communicated, strict=True)
                   if id(p) not in self._launched]
        pending, self._pending, self._launched, self._armed = self._pending, [], set(), False
        if missing and len(missing) == len(self.communicated):
            raise RuntimeError("DDPIndividualParameters: no gradient hook fired this step; run the forward "
                               "pass through the wrapper (not its .module) before backward")
        if missing:
            raise RuntimeError(f"DDPIndividualParameters: parameter {missing[0]!r} got no gradient this step"
                               + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                               + "; ranks may have launched different all-reduces. Freeze it, or use "
                               "DDPBucketed, which handles unused parameters")
        for bucket, future in pending:
            self._finish_future(bucket, future)

    def message_numels(self) -> list[int]:
        return [p.numel() for p in reversed(self.communicated)]

    def _name_of(self, parameter: torch.Tensor) -> str:
        for name, p in zip(self.parameter_names, self.communicated, strict=True):
            if p is parameter:
                return name
        return "?"

    def remove_hooks(self) -> None:
        """Detach from the module's parameters (the module keeps working unwrapped)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
