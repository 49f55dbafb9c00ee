"""Memory one data-parallel rank holds, split into parameters, gradients and optimizer state.

Counted by walking the tensors themselves (each storage once), not from allocator statistics: the split
is exact and the same on CPU and CUDA, and it shows what sharding removes. Activations and temporary
buffers are not in it (they are gone at the points measured: after init, before and after the
optimizer step). Communication buffers a wrapper keeps across steps count as gradient memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

MiB = 2**20
PARTS = ("params", "grads", "optimizer")


def unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state (for a ShardedOptimizer: this rank's shard)."""
    tensors = []
    for state in optimizer.state.values():
        tensors.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    return tensors


def memory_split(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                 communication_buffers: Iterable[torch.Tensor] = ()) -> dict[str, float]:
    """MiB held now: `params`, `grads` (plus communication buffers), `optimizer` state, and `total`."""
    parameters = list(model.parameters())
    grads = [p.grad for p in parameters if p.grad is not None] + list(communication_buffers)
    split: dict[str, Any] = {
        "params": unique_bytes(parameters) / MiB,
        "grads": unique_bytes(grads) / MiB,
        "optimizer": unique_bytes(optimizer_state_tensors(optimizer)) / MiB if optimizer is not None else 0.0,
    }
    split["total"] = sum(split[part] for part in PARTS)
    return split
