"""An MoE layer split over expert-parallel ranks: every rank holds the router and the shared experts, and
n_experts / ep of the routed experts (rank r owns experts r·E/ep ... (r+1)·E/ep - 1).

One forward on rank r (its own T tokens), on the single-process fast path's pieces (`nn.moe_routing`,
`nn.moe_dispatch`, `nn.moe_gemm`) around the all-to-alls:
1. router: route the T tokens (top-k, capacity, and the one sort of the assignments by expert, hence by
   owning rank);
2. dispatch: exchange the kept count of every expert (one all-to-all of E integers), read the send and receive
   sizes on the host (the one host sync of the layer: `all_to_all_single` takes its splits as Python ints),
   pack the kept assignments in sorted order by index arithmetic (no second sort, no boolean mask), and send
   their token rows with `all_to_all_single` and uneven splits. Dropped assignments are never sent;
3. experts: the received rows, which arrive grouped by source rank and then by expert, are copied once into the
   expert buffer in the layout of the GEMMs (`nn.moe_gemm`: sorted by expert, or padded blocks; where each row
   goes follows from the exchanged counts: nothing is sent besides the rows), run through the owned experts,
   and read back in arrival order;
4. combine: the rows go back with the mirrored all-to-all, and each token's rows are weighted and summed in one
   `embedding_bag` (dropped assignments weigh 0); the shared experts (local) are added.
The result equals the single-process `MoE` on the same tokens (the benchmark checks it before timing). Forward
only: this measures the communication of the dispatch and combine against the expert compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from stepscope.nn.moe import MoE
from stepscope.nn.moe_dispatch import expert_mlp_grouped
from stepscope.nn.moe_gemm import Layout, choose_layout, gemm_kind
from stepscope.nn.moe_routing import Routing

PIECES = ("router", "dispatch", "experts", "combine", "shared")
"""The timed pieces of one forward, in order."""


class ExpertParallelMoE:
    """Rank `rank` of `world` ranks running `block`'s routed experts expert-parallel (weights sliced, not
    copied: every rank built the same block from the same seed)."""

    def __init__(self, block: MoE, rank: int, world: int, group: dist.ProcessGroup | None = None) -> None:
        self.block, self.rank, self.world, self.group = block, rank, world, group
        self.local = block.router.n_experts // world
        owned = slice(rank * self.local, (rank + 1) * self.local)
        experts = block.experts
        self.weights = tuple(p[owned] if p is not None else None
                             for p in (experts.w_up, experts.w_down, experts.b_up, experts.b_down))
        self.gated = experts.gated
        self.sent_rows = 0
        """Token rows this rank sent in the last dispatch (to itself included)."""

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, lap: Callable[[str], None] = lambda piece: None) -> torch.Tensor:
        """x: (T, d) -> (T, d); `lap(piece)` is called when each piece ends (the benchmark's clock)."""
        routing = self.block.router(x)
        lap("router")
        kept_counts = routing.kept_counts
        recv_counts = torch.empty_like(kept_counts)  # [source rank, my local expert], flattened
        dist.all_to_all_single(recv_counts, kept_counts, group=self.group)
        sizes = torch.cat([kept_counts, recv_counts]).tolist()  # the layer's one host sync
        per_expert, received = sizes[:len(sizes) // 2], sizes[len(sizes) // 2:]
        send = [sum(per_expert[r * self.local:(r + 1) * self.local]) for r in range(self.world)]
        recv = [sum(received[r * self.local:(r + 1) * self.local]) for r in range(self.world)]
        packed = pack_kept(routing, sum(send))
        rows = x.index_select(0, packed // routing.experts.shape[1])
        arrived = x.new_empty(sum(recv), x.shape[1])
        dist.all_to_all_single(arrived, rows, recv, send, group=self.group)
        self.sent_rows = rows.shape[0]
        lap("dispatch")
        outputs = self._experts(arrived, received)
        lap("experts")
        back = x.new_empty(rows.shape)
        dist.all_to_all_single(back, outputs, send, recv, group=self.group)
        out = combine_kept(back, routing, packed_row_of_assignment(routing))
        lap("combine")
        for shared in self.block.shared:
            out = out + shared(x)
        lap("shared")
        return out

    def _experts(self, arrived: torch.Tensor, received: list[int]) -> torch.Tensor:
        """The owned experts on the rows that arrived ([source][expert] blocks, sizes `received`), in arrival
        order: each row copied once into the expert buffer of the GEMM's layout and read back once."""
        if arrived.shape[0] == 0:
            return arrived
        kind = gemm_kind(arrived.device, arrived.dtype, (self.weights[0].shape[1], self.weights[0].shape[2],
                                                         self.weights[1].shape[1]))
        counts = [sum(received[s * self.local + e] for s in range(self.world)) for e in range(self.local)]
        # where each expert's rows begin in the buffer: packed one after another, or in blocks of the busiest's
        per_expert = max(counts)
        kind = choose_layout(self.local, per_expert, arrived.shape[0]) if kind == "auto" else kind
        starts = [e * per_expert for e in range(self.local)] if kind == "bmm" else \
            [sum(counts[:e]) for e in range(self.local)]
        bases, filled = [], [0] * self.local  # a block's first row: its expert's start plus the earlier sources'
        for s in range(self.world):
            for e in range(self.local):
                bases.append(starts[e] + filled[e])
                filled[e] += received[s * self.local + e]
        device = arrived.device
        if kind == "bmm":
            layout = Layout.padded(self.local, per_expert, device)
        else:
            layout = Layout.sorted(torch.tensor(counts, device=device), torch.repeat_interleave(
                torch.arange(self.local, device=device), torch.tensor(counts, device=device),
                output_size=arrived.shape[0]))
        rows = regroup_index(bases, received, device)  # the buffer row of each arrived row
        buffer = arrived.new_zeros(layout.rows, arrived.shape[1]).index_copy_(0, rows, arrived)
        y = expert_mlp_grouped(buffer, None, layout, *self.weights, self.gated)
        return y.index_select(0, rows)


def regroup_index(starts: list[int], sizes: list[int], device: torch.device) -> torch.Tensor:
    """The concatenation of arange(start, start + size) over the blocks (the buffer row of every row of each
    block), built on the device in one `repeat_interleave` (no Python loop over rows)."""
    total = sum(sizes)
    sizes_t = torch.tensor(sizes, dtype=torch.long).to(device)
    block_start = torch.tensor(starts, dtype=torch.long).to(device)
    block_offset = torch.cumsum(sizes_t, 0) - sizes_t  # where each block begins in the output
    return torch.arange(total, device=device) + torch.repeat_interleave(block_start - block_offset, sizes_t,
                                                                        output_size=total)


def pack_kept(routing: Routing, kept: int) -> torch.Tensor:
    """(kept,) the flat indices of the kept assignments in expert order: `Routing.order` with the dropped ones
    left out, by a running count rather than a boolean mask (whose size the host would have to read)."""
    keep_sorted = routing.keep.reshape(-1).index_select(0, routing.order)
    position = torch.where(keep_sorted, torch.cumsum(keep_sorted, 0) - 1, kept)  # dropped: one spare slot
    return torch.empty(kept + 1, dtype=torch.long, device=keep_sorted.device).scatter_(
        0, position, routing.order)[:kept]


def packed_row_of_assignment(routing: Routing) -> torch.Tensor:
    """(T, k) the row of each kept assignment among the packed (sent) rows; 0 for the dropped ones, whose weight
    is 0."""
    keep_sorted = routing.keep.reshape(-1).index_select(0, routing.order)
    packed = torch.empty_like(routing.order).scatter_(0, routing.order, torch.cumsum(keep_sorted, 0) - 1)
    return torch.where(routing.keep, packed.view_as(routing.keep), 0)


def combine_kept(back: torch.Tensor, routing: Routing, rows: torch.Tensor) -> torch.Tensor:
    """Each token's returned rows weighted by its combine weights and summed (one `embedding_bag`)."""
    tokens = routing.experts.shape[0]
    if back.shape[0] == 0:  # every assignment was dropped: only the shared experts remain
        return back.new_zeros(tokens, back.shape[1])
    weights = routing.kept_weights().to(back.dtype)
    return F.embedding_bag(rows, back, mode="sum", per_sample_weights=weights)


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
