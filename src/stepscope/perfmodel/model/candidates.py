"""Many parallel plans as parallel numpy arrays (one element per plan), and their group placement.

Placement is an index into `PLACEMENTS`, the 24 orders of (tp, cp, dp, pp) on rank numbers (innermost
first). A group's stride is the product of the sizes nested inside it; with the system's domain size it
gives how many members of each group share a fast domain (`collectives.members_per_domain`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from stepscope.perfmodel.model import collectives
from stepscope.spec.plan import DIMENSIONS, RECOMPUTE, ParallelPlan
from stepscope.spec.stack import DEFAULT_STACK

PLACEMENTS: tuple[tuple[str, ...], ...] = tuple(itertools.permutations(DIMENSIONS))
_PLACEMENT_INDEX = {order: i for i, order in enumerate(PLACEMENTS)}
_PERM_DIMS = np.array([[DIMENSIONS.index(d) for d in order] for order in PLACEMENTS], dtype=np.int64)


def canonical_placements(sizes: dict[str, int]) -> list[int]:
    """Placement indices that differ for these group sizes: size-1 dimensions do not matter, so only the
    orders that put them last (in DIMENSIONS order) are kept: k! placements for k dimensions of size > 1."""
    trivial = [d for d in DIMENSIONS if sizes[d] == 1]
    out = []
    for i, order in enumerate(PLACEMENTS):
        tail = list(order[len(order) - len(trivial):]) if trivial else []
        if tail == trivial:
            out.append(i)
    return out


@dataclass
class Candidates:
    """Plans as arrays; the boolean switches that a search keeps fixed are plain scalars."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    micro_batch: np.ndarray
    interleave: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    """0 none, 1 selective, 2 full (index into spec.plan.RECOMPUTE)."""
    sequence_parallel: np.ndarray
    flash_attention: np.ndarray
    placement: np.ndarray
    """Index into PLACEMENTS."""
    first_stage_layers: np.ndarray | None = None
    """Layers of the first pipeline stage (0: even split; None: all even)."""
    last_stage_layers: np.ndarray | None = None
    """Layers of the last pipeline stage (0: even split; None: all even)."""
    shard_group: np.ndarray | None = None
    """ZeRO/FSDP shard group size (0: all dp x cp ranks; None: all 0)."""
    ep: np.ndarray | None = None
    """Expert-parallel group size (None: all 1)."""
    expert_imbalance: float = 1.0
    ep_overlap: bool = False
    dispatcher: str = "alltoall"
    expert_tp: int = 0
    pipeline_rounds: int = 1
    reshard_after_forward: bool = True
    fp8_recipe: str = "delayed"
    dropout: bool = False
    fp32_grads: bool = False
    dp_overlap: bool = True
    tp_overlap: bool = False
    stack: str = DEFAULT_STACK
    layout: dict[str, np.ndarray] | None = None
    """Members per fast domain of each dimension's group, when the caller computed them already."""

    def __post_init__(self) -> None:
        for name in ("first_stage_layers", "last_stage_layers", "shard_group"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(len(self.dp), dtype=np.int64))
        if self.ep is None:
            self.ep = np.ones(len(self.dp), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.dp)

    @property
    def gpus(self) -> np.ndarray:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def sizes(self) -> np.ndarray:
        """(n, 4) group sizes in DIMENSIONS order."""
        return np.stack([getattr(self, d) for d in DIMENSIONS], axis=1)

    def members_per_domain(self, domain_size: int) -> dict[str, np.ndarray]:
        """Members of each dimension's group inside one fast domain (precomputed by a search, or computed)."""
        if self.layout is not None:
            return self.layout
        return members_per_domain(self.sizes, self.placement, domain_size)

    def subset(self, mask: np.ndarray) -> Candidates:
        """The candidates where `mask` is true (fancy indexing works too)."""
        arrays = {f.name: getattr(self, f.name)[mask] for f in fields(self) if isinstance(getattr(self, f.name),
                                                                                          np.ndarray)}
        scalars = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name != "layout" and not isinstance(getattr(self, f.name), np.ndarray)}
        layout = {d: g[mask] for d, g in self.layout.items()} if self.layout is not None else None
        return Candidates(**arrays, **scalars, layout=layout)

    def plan(self, i: int) -> ParallelPlan:
        """Candidate `i` as a ParallelPlan."""
        return ParallelPlan(dp=int(self.dp[i]), tp=int(self.tp[i]), pp=int(self.pp[i]), cp=int(self.cp[i]),
                            sequence_parallel=bool(self.sequence_parallel[i]), zero=int(self.zero[i]),
                            recompute=RECOMPUTE[int(self.recompute[i])], interleave=int(self.interleave[i]),
                            micro_batch=int(self.micro_batch[i]), flash_attention=bool(self.flash_attention[i]),
                            dropout=self.dropout, fp32_grads=self.fp32_grads, dp_overlap=self.dp_overlap,
                            tp_overlap=self.tp_overlap, placement=PLACEMENTS[int(self.placement[i])],
                            first_stage_layers=int(self.first_stage_layers[i]),
                            last_stage_layers=int(self.last_stage_layers[i]), shard_group=int(self.shard_group[i]),
                            reshard_after_forward=self.reshard_after_forward, fp8_recipe=self.fp8_recipe,
                            ep=int(self.ep[i]), expert_imbalance=self.expert_imbalance, ep_overlap=self.ep_overlap,
                            dispatcher=self.dispatcher, expert_tp=self.expert_tp,
                            pipeline_rounds=self.pipeline_rounds, stack=self.stack)

    @classmethod
    def from_plans(cls, plans: Sequence[ParallelPlan]) -> Candidates:
        """Arrays from ParallelPlans that share the scalar switches (dropout, fp32_grads, overlaps, resharding,
        fp8 recipe)."""
        first = plans[0]

        def switches(p: ParallelPlan) -> tuple:
            return (p.dropout, p.fp32_grads, p.dp_overlap, p.tp_overlap, p.reshard_after_forward, p.fp8_recipe,
                    p.expert_imbalance, p.ep_overlap, p.dispatcher, p.expert_tp, p.pipeline_rounds, p.stack)

        if any(switches(plan) != switches(first) for plan in plans):
            raise ValueError("plans must share dropout, fp32_grads, dp_overlap, tp_overlap, reshard_after_forward, "
                             "fp8_recipe, expert_imbalance, ep_overlap, dispatcher, expert_tp, pipeline_rounds and "
                             "stack")

        def ints(get) -> np.ndarray:
            return np.array([get(p) for p in plans], dtype=np.int64)

        return cls(dp=ints(lambda p: p.dp), tp=ints(lambda p: p.tp), pp=ints(lambda p: p.pp), cp=ints(lambda p: p.cp),
                   micro_batch=ints(lambda p: p.micro_batch), interleave=ints(lambda p: p.interleave),
                   zero=ints(lambda p: p.zero), recompute=ints(lambda p: RECOMPUTE.index(p.recompute)),
                   sequence_parallel=np.array([p.sequence_parallel for p in plans], dtype=bool),
                   flash_attention=np.array([p.flash_attention for p in plans], dtype=bool),
                   placement=ints(lambda p: _PLACEMENT_INDEX[tuple(p.placement)]),
                   first_stage_layers=ints(lambda p: p.first_stage_layers),
                   last_stage_layers=ints(lambda p: p.last_stage_layers), shard_group=ints(lambda p: p.shard_group),
                   ep=ints(lambda p: p.ep), expert_imbalance=first.expert_imbalance, ep_overlap=first.ep_overlap,
                   dispatcher=first.dispatcher, expert_tp=first.expert_tp, pipeline_rounds=first.pipeline_rounds,
                   reshard_after_forward=first.reshard_after_forward, fp8_recipe=first.fp8_recipe,
                   dropout=first.dropout, fp32_grads=first.fp32_grads, dp_overlap=first.dp_overlap,
                   tp_overlap=first.tp_overlap, stack=first.stack)


def members_per_domain(sizes: np.ndarray, placement: np.ndarray, domain_size: int) -> dict[str, np.ndarray]:
    """Element-wise `collectives.members_per_domain` for (n, 4) group sizes and n placement indices."""
    order = _PERM_DIMS[placement]  # (n, 4): dimension index at each nesting level
    sizes_in_order = np.take_along_axis(sizes, order, axis=1)
    strides_in_order = np.ones_like(sizes_in_order)
    strides_in_order[:, 1:] = np.cumprod(sizes_in_order[:, :-1], axis=1)
    strides = np.empty_like(strides_in_order)
    np.put_along_axis(strides, order, strides_in_order, axis=1)
    g = collectives.members_per_domain(sizes, strides, domain_size)
    return {d: g[:, i] for i, d in enumerate(DIMENSIONS)}


def concatenate(parts: Sequence[Candidates]) -> Candidates:
    """Join candidate sets that share their scalar switches."""
    first = parts[0]
    arrays = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(first)
              if isinstance(getattr(first, f.name), np.ndarray)}
    scalars = {f.name: getattr(first, f.name) for f in fields(first)
               if f.name != "layout" and not isinstance(getattr(first, f.name), np.ndarray)}
    layout = None
    if all(p.layout is not None for p in parts):
        layout = {d: np.concatenate([p.layout[d] for p in parts]) for d in DIMENSIONS}
    return Candidates(**arrays, **scalars, layout=layout)
