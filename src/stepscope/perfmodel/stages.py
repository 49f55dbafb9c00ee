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
    dense: int = 0
    """Of its layers, how many are dense blocks (the rest are Mixture-of-Experts blocks)."""

    @property
    def moe(self) -> int:
        return self.layers - self.dense


def pipeline_stages(plan: ParallelPlan, n_layers: int, micro_batches: int,
                    dense_layers: int | None = None) -> list[Stage]:
    """The distinct stages: one with everything (pp = 1), or first, middle (pp > 2) and last. Stage i of 1F1B
    holds min(p - i, m) micro-batches: the first p, the second (the fullest middle stage) p - 1, the last 1.
    `dense_layers` (a Mixture-of-Experts model's leading dense blocks; None: every block is dense) sit on the
    first stage; those that do not fit there are counted as MoE blocks of the middle stages (which hold more
    parameters and at least the activated work of a dense block, so the fullest middle stage is bounded)."""
    first, middle, last = plan.stage_layers(n_layers)
    p, m = plan.pp, micro_batches

    def dense(layers: int, leading: bool) -> int:
        return layers if dense_layers is None else (min(dense_layers, layers) if leading else 0)

    if p == 1:
        return [Stage("only", n_layers, True, True, min(1, m), dense(n_layers, True))]
    stages = [Stage("first", first, True, False, min(p, m), dense(first, True))]
    if p > 2:
        stages.append(Stage("middle", middle, False, False, min(p - 1, m), dense(middle, False)))
    return stages + [Stage("last", last, False, True, 1, dense(last, False))]
