"""The distinct stages of a pipeline: how many layers each holds, which holds the embedding and the head, and
how many micro-batches of activations each keeps at its peak under Megatron-Core's 1F1B schedules
(`held_micro_batches`). Shared by the time (`evaluate`) and the memory (`memory`) of a plan; `vectorized` has
the array form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.spec.plan import ParallelPlan


@dataclass(frozen=True)
class Stage:
    """One kind of pipeline stage: its layers and whether it holds the embedding / the head."""

    name: str
    layers: int
    embedding: bool
    head: bool
    in_flight: float
    """Micro-batches of its layers whose activations it holds at its peak (`held_micro_batches`)."""
    dense: int = 0
    """Of its layers, how many are dense blocks (the rest are Mixture-of-Experts blocks)."""

    @property
    def moe(self) -> int:
        return self.layers - self.dense


def held_micro_batches(pp, rank, interleave, micro_batches):
    """Micro-batches of a pipeline rank's layers whose activations it holds at its peak; ints or arrays.
    1F1B: its warm-up of p − rank − 1 forwards and the one in flight, min(p − rank, m). Interleaved 1F1B with v
    chunks (Megatron-Core's schedule, micro-batches grouped by p): a warm-up of 2(p − rank − 1) + (v − 1)·p chunk
    forwards and the one in flight, each chunk 1/v of its layers; at most all m micro-batches. On rank 0 this is
    Korthikanti et al.'s p·(1 + (p−1)/(p·v)); later ranks hold nearly as much (the last p − (p−1)/v), unlike
    plain 1F1B's p − rank."""
    plain = np.minimum(pp - rank, micro_batches)
    chunks = (2 * (pp - rank - 1) + (interleave - 1) * pp + 1) / interleave
    return np.where(interleave > 1, np.minimum(chunks, micro_batches), plain)


def pipeline_stages(plan: ParallelPlan, n_layers: int, micro_batches: int,
                    dense_layers: int | None = None) -> list[Stage]:
    """The distinct stages: one with everything (pp = 1), or first (rank 0), middle (pp > 2: rank 1, the
    fullest of them) and last, each holding `held_micro_batches` of its rank (of one pipeline round's
    micro-batches, `ParallelPlan.pipeline_rounds`). `dense_layers` (a
    Mixture-of-Experts model's leading dense blocks; None: every block is dense) sit on the first stage; those
    that do not fit there are counted as MoE blocks of the middle stages (which hold more parameters and at
    least the activated work of a dense block, so the fullest middle stage is bounded)."""
    first, middle, last = plan.stage_layers(n_layers)
    p = plan.pp
    m = micro_batches // plan.pipeline_rounds if p > 1 else micro_batches  # a round holds at most its own

    def held(rank: int) -> float:
        return float(held_micro_batches(p, rank, plan.interleave, m))

    def dense(layers: int, leading: bool) -> int:
        return layers if dense_layers is None else (min(dense_layers, layers) if leading else 0)

    if p == 1:
        return [Stage("only", n_layers, True, True, min(1, m), dense(n_layers, True))]
    stages = [Stage("first", first, True, False, held(0), dense(first, True))]
    if p > 2:
        stages.append(Stage("middle", middle, False, False, held(1), dense(middle, False)))
    return stages + [Stage("last", last, False, True, held(p - 1), dense(last, False))]
