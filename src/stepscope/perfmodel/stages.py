"""The distinct stages of a pipeline: how many layers each holds, which holds the embedding and the head, and
how many micro-batches of activations each keeps at its peak under 1F1B. Shared by the time (`evaluate`) and
the memory (`memory`) of a plan; `vectorized` has the array form."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.spec.plan import ParallelPlan


@dataclass(frozen=True)
class Stage:
    """One kind of pipeline stage: its layers and whether it holds the embedding / the head."""

    name: str
    layers: int
    embedding: bool
    head: bool
    in_flight: int
    """Micro-batches whose activations it holds at its peak under 1F1B (before interleaving)."""


def pipeline_stages(plan: ParallelPlan, n_layers: int, micro_batches: int) -> list[Stage]:
    """The distinct stages: one with everything (pp = 1), or first, middle (pp > 2) and last. Stage i of 1F1B
    holds min(p - i, m) micro-batches: the first p, the second (the fullest middle stage) p - 1, the last 1."""
    first, middle, last = plan.stage_layers(n_layers)
    p, m = plan.pp, micro_batches
    if p == 1:
        return [Stage("only", n_layers, True, True, min(1, m))]
    stages = [Stage("first", first, True, False, min(p, m))]
    if p > 2:
        stages.append(Stage("middle", middle, False, False, min(p - 1, m)))
    return stages + [Stage("last", last, False, True, 1)]
