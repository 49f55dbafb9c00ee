"""`ShardedOptimizer`: optimizer-state sharding across data-parallel ranks (ZeRO stage 1).

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)

Every parameter gets one owner rank, balanced by size (largest first, each to the least-loaded rank;
ties go to the lower rank, so every rank computes the same assignment without communicating). A rank
runs the wrapped optimizer only on the parameters it owns, so only it holds their state (Adam's m and v:
8 bytes per fp32 parameter become 8/N per rank). After `step()` each owner broadcasts its updated
parameters (flattened per owner and dtype: one broadcast per rank and dtype, not one per tensor).

The result is bit-identical to running the wrapped optimizer unsharded on every rank, because each
parameter is updated by exactly the same code on exactly the same gradient, and only copied elsewhere.
Gradients must already be averaged across ranks (a DDP wrapper's `finish_gradient_synchronization`).

It is a real `torch.optim.Optimizer`: `param_groups` holds ALL parameters (so `zero_grad` clears every
gradient and LR schedulers see every group; options are copied to the local optimizer before each step),
`add_param_group` works after construction, and `state` is this rank's shard (so `state_dict()` is the
rank's shard, indexed like the full optimizer's, and `load_state_dict` restores it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls`; each rank keeps the state of, and updates, only the parameters it owns."""

    def __init__(self, params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer], *,
                 process_group: dist.ProcessGroup | None = None, **kwargs: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs torch.distributed initialized")
        # set before the base constructor, which calls our add_param_group for every group
        self.optimizer_cls = optimizer_cls
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._owner: dict[int, int] = {}  # id(parameter) -> owning rank within the group
        self._owned_numel = [0] * self.world_size
        self._broadcast_plan: list[tuple[int, list[torch.Tensor]]] | None = None
        self.broadcast = True
        """False: `step` updates this rank's shard and sends nothing (a benchmark's compute-only rounds, whose
        local gradients differ per rank: under fp16 loss scaling one rank may skip a step the others take)."""
        super().__init__(params, defaults=dict(kwargs))
        self.state = self.local_optimizer.state  # type: ignore[union-attr]

    # ---- ownership ----------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for parameter in sorted(group["params"], key=lambda p: -p.numel()):  # stable: ties keep group order
            owner = min(range(self.world_size), key=lambda rank: (self._owned_numel[rank], rank))
            self._owner[id(parameter)] = owner
            self._owned_numel[owner] += parameter.numel()
        local_group = {key: value for key, value in group.items() if key != "params"}
        local_group["params"] = [p for p in group["params"] if self._owner[id(p)] == self.rank]
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group], **self.defaults)
        else:
            self.local_optimizer.add_param_group(local_group)
        # the wrapped optimizer filled in its own defaults: make them visible (and schedulable) here too
        for key, value in self.local_optimizer.param_groups[-1].items():
            if key != "params":
                group.setdefault(key, value)
        self._broadcast_plan = None

    def owner_of(self, parameter: torch.Tensor) -> int:
        """The rank (within the process group) that updates `parameter` and holds its state."""
        return self._owner[id(parameter)]

    @property
    def owned_numel(self) -> list[int]:
        """Elements owned by each rank."""
        return list(self._owned_numel)

    # ---- the step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        assert self.local_optimizer is not None
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            local.update({key: value for key, value in group.items() if key != "params"})
        self.local_optimizer.step()
        if self.broadcast:
            self._synchronize_parameters()
        return loss

    def _synchronize_parameters(self) -> None:
        """Every parameter from its owner: one flat broadcast per (owner, dtype)."""
        if self.world_size == 1:
            return
        for owner, parameters in self._plan():
            source = owner if self.process_group is None else dist.get_global_rank(self.process_group, owner)
            if owner == self.rank:
                flat = torch.cat([p.detach().reshape(-1) for p in parameters])
            else:
                flat = torch.empty(sum(p.numel() for p in parameters), dtype=parameters[0].dtype,
                                   device=parameters[0].device)
            dist.broadcast(flat, src=source, group=self.process_group)
            if owner != self.rank:
                views, offset = [], 0
                for p in parameters:
                    views.append(flat[offset:offset + p.numel()].view(p.shape))
                    offset += p.numel()
                torch._foreach_copy_([p.detach() for p in parameters], views)

    def _plan(self) -> list[tuple[int, list[torch.Tensor]]]:
        """(owner, parameters of one dtype) in an order every rank agrees on."""
        if self._broadcast_plan is None:
            plan: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
            for group in self.param_groups:
                for p in group["params"]:
                    plan.setdefault((self._owner[id(p)], p.dtype), []).append(p)
            self._broadcast_plan = [(owner, params) for (owner, _), params in plan.items()]
        return self._broadcast_plan

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        assert self.local_optimizer is not None
        self.local_optimizer.state = self.state  # the base class replaced the dict; keep sharing it
