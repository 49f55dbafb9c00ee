"""An MoE layer split over expert-parallel ranks: every rank holds the router and the shared experts, and
n_experts / ep of the routed experts (rank r owns experts r·E/ep ... (r+1)·E/ep - 1).

One forward on rank r (its own T tokens):
1. router: route the T tokens (top-k, capacity as `nn.moe.Router` computes it on these tokens);
2. dispatch: sort the kept assignments by expert (hence by owning rank), exchange the per-rank counts
   (an all-to-all of ep integers), then send the token rows and their local expert ids with
   `all_to_all_single` and uneven splits;
3. experts: each owned expert runs on the rows it received (a contiguous run after a stable sort);
4. combine: the expert outputs go back with the mirrored all-to-all, are weighted and summed per token;
   the shared experts (local) are added.
The result equals the single-process `MoE` on the same tokens (the benchmark checks it before timing). Forward
only: this measures the communication of the dispatch and combine against the expert compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from stepscope.nn.moe import MoE, expert_mlp

PIECES = ("router", "dispatch", "experts", "combine", "shared")
"""The timed pieces of one forward, in order."""


class ExpertParallelMoE:
    """Rank `rank` of `world` ranks running `block`'s routed experts expert-parallel (weights sliced, not
    copied: every rank built the same block from the same seed)."""

    def __init__(self, block: MoE, rank: int, world: int, group: dist.ProcessGroup | None = None) -> None:
        self.block, self.rank, self.world, self.group = block, rank, world, group
        self.local = block.router.n_experts // world
        first = rank * self.local
        experts = block.experts
        owned = slice(first, first + self.local)
        self.weights = [(experts.w_up[e], experts.w_down[e],
                         experts.b_up[e] if experts.b_up is not None else None,
                         experts.b_down[e] if experts.b_down is not None else None)
                        for e in range(owned.start, owned.stop)]
        self.gated = experts.gated
        self.sent_rows = 0
        """Token rows this rank sent in the last dispatch (to itself included)."""

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, lap: Callable[[str], None] = lambda piece: None) -> torch.Tensor:
        """x: (T, d) -> (T, d); `lap(piece)` is called when each piece ends (the benchmark's clock)."""
        routing = self.block.router(x)
        lap("router")
        k = routing.experts.shape[1]
        kept = routing.keep.reshape(-1).nonzero().squeeze(1)
        expert = routing.experts.reshape(-1)[kept]
        order = torch.argsort(expert, stable=True)
        kept, expert = kept[order], expert[order]
        token = kept // k
        owner = expert // self.local
        send_counts = torch.bincount(owner, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        rows = x.new_empty(sum(recv), x.shape[1])
        dist.all_to_all_single(rows, x[token], recv, send, group=self.group)
        local_expert = torch.empty(sum(recv), dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(local_expert, expert - owner * self.local, recv, send, group=self.group)
        self.sent_rows = len(token)
        lap("dispatch")
        outputs = torch.empty_like(rows)
        order = torch.argsort(local_expert, stable=True)
        counts = torch.bincount(local_expert, minlength=self.local).tolist()
        start = 0
        for weights, count in zip(self.weights, counts, strict=True):
            if count:
                index = order[start:start + count]
                outputs[index] = expert_mlp(rows[index], *weights, self.gated)
            start += count
        lap("experts")
        back = x.new_empty(len(token), x.shape[1])
        dist.all_to_all_single(back, outputs, send, recv, group=self.group)
        weights = routing.weights.reshape(-1)[kept].unsqueeze(1).to(back.dtype)
        out = torch.zeros_like(x).index_add(0, token, back * weights)
        lap("combine")
        for shared in self.block.shared:
            out = out + shared(x)
        lap("shared")
        return out


def reference_forward(block: MoE, x: torch.Tensor) -> torch.Tensor:
    """The single-process layer on the same tokens (the reference expert loop)."""
    impl = block.experts.impl
    block.experts.impl = "reference"
    try:
        with torch.no_grad():
            return block(x.unsqueeze(0)).squeeze(0)
    finally:
        block.experts.impl = impl


def timed_laps(device: torch.device) -> tuple[Callable[[str], None], dict[str, float], Callable[[], None]]:
    """(lap, seconds per piece of the last call, reset) for one forward."""
    from stepscope.measure.device import synchronize

    seconds: dict[str, float] = {}
    last = [time.perf_counter()]

    def lap(piece: str) -> None:
        synchronize(device)
        now = time.perf_counter()
        seconds[piece] = now - last[0]
        last[0] = now

    def reset() -> None:
        synchronize(device)
        seconds.clear()
        last[0] = time.perf_counter()

    return lap, seconds, reset
