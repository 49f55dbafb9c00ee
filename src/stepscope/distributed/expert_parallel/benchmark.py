"""`stepscope moe`: one MoE layer expert-parallel over spawned ranks; dispatch and combine all-to-all timed
against the expert compute.

Every rank builds the same `nn.moe.MoE` block (seeded), draws its own tokens, checks once that the
expert-parallel forward equals the single-process reference on its tokens, then times `warmup` + `iters`
forwards piece by piece (router, dispatch, experts, combine, shared; a barrier before each call so the ranks
start together). A collective's time includes waiting for the slowest rank, so dispatch and combine carry
the load imbalance. Reported per piece: the median over iterations of the slowest rank's time (nccl-tests'
convention for a collective), and the dispatch volume (token rows x d_model x bytes) of the busiest rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from stepscope.distributed.expert_parallel.config import EPConfig
from stepscope.distributed.expert_parallel.layer import PIECES
from stepscope.measure.stats import Stats
from stepscope.results.store import RecordStore, make_record
from stepscope.results.tables import Table

MATCH_TOLERANCE = 1e-4
"""Largest |EP − reference| / max |reference| accepted: the same fp32 arithmetic summed in another order differs
by about 1e-6; a wrong dispatch or combine differs by order 1."""


@dataclass
class EPResult:
    """Per piece, the per-iteration time of the slowest rank; the check; the load."""

    config: EPConfig
    pieces: dict[str, Stats]
    """router, dispatch, experts, combine, shared and layer (their sum), seconds."""
    max_abs_error: float
    """Largest |EP - reference| over the ranks' outputs, relative to the largest |reference|."""
    dispatch_bytes: int
    """Token bytes the busiest rank sent in one dispatch (the combine returns as many)."""
    dispatch_rows: int
    """Token rows all ranks sent in one dispatch together: the kept assignments, never a dropped one."""
    dropped: int
    """Assignments the capacity dropped, over all ranks (0 when dropless)."""
    load_max_over_mean: float
    """Assignments of the busiest expert over the mean (1 = perfectly balanced), summed over ranks."""
    threads: int

    @property
    def matches(self) -> bool:
        """The expert-parallel output equals the single-process layer's (within MATCH_TOLERANCE)."""
        return self.max_abs_error <= MATCH_TOLERANCE

    def check_line(self) -> str:
        """One line: whether the output matched, and by how much."""
        verdict = "equals" if self.matches else f"DIFFERS from (tolerance {MATCH_TOLERANCE:g}; timings not valid)"
        return f"output {verdict} the single-process layer: max |error| {self.max_abs_error:.2e} of max |output|"

    def rows(self) -> list[dict[str, Any]]:
        layer = self.pieces["layer"].median
        rows = []
        for piece, stats in self.pieces.items():
            ms = stats.scaled(1e3)
            row = {"piece": piece, "median_ms": ms.median, "p10_ms": ms.p10, "p90_ms": ms.p90,
                   "pct_of_layer": 100.0 * stats.median / layer if layer else None, "GBps": None}
            if piece in ("dispatch", "combine") and stats.median > 0:
                row["GBps"] = self.dispatch_bytes / stats.median / 1e9
            rows.append(row)
        return rows

    def table(self) -> Table:
        c = self.config
        title = (f"{c.model.name} MoE layer, {c.tokens} tokens per rank, expert-parallel over {c.ep} ranks "
                 f"({c.model.n_experts // c.ep} of {c.model.n_experts} experts each, top-{c.model.experts_per_token}"
                 f", {c.backend}, {self.threads} threads per rank); time of the slowest rank")
        return Table("moe-ep", title, ("piece",), self.rows())

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for piece, stats in self.pieces.items():
            metrics.update(stats.metrics(piece))
        metrics.update({"max_abs_error": self.max_abs_error, "dispatch_bytes": self.dispatch_bytes,
                        "dispatch_rows": self.dispatch_rows, "dropped_assignments": self.dropped,
                        "load_max_over_mean": self.load_max_over_mean, "threads": self.threads,
                        "comm_pct": 100.0 * (self.pieces["dispatch"].median + self.pieces["combine"].median)
                        / self.pieces["layer"].median})
        return metrics


def _rank(ctx: Any, config: EPConfig) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from stepscope.distributed.expert_parallel.layer import ExpertParallelMoE, reference_forward, timed_laps
    from stepscope.nn.moe import MoE
    from stepscope.nn.transformer import MLP

    device = torch.device(ctx.device)
    torch.manual_seed(config.seed)  # the same weights on every rank
    block = MoE(config.model, "reference", shared=MLP).to(device)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + ctx.rank)
    x = torch.randn(config.tokens, config.model.d_model, generator=generator).to(device)
    layer = ExpertParallelMoE(block, ctx.rank, ctx.world_size)
    out = layer(x)
    reference = reference_forward(block, x)
    error = ((out - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item()
    with torch.no_grad():
        routing = block.router(x)
    counts = torch.bincount(routing.experts[routing.keep], minlength=config.model.n_experts)
    dist.all_reduce(counts)
    lap, seconds, reset = timed_laps(device)
    samples: list[dict[str, float]] = []
    for index in range(config.warmup + config.iters):
        dist.barrier()
        reset()
        layer(x, lap)
        if index >= config.warmup:
            samples.append(dict(seconds))
    bytes_sent = layer.sent_rows * config.model.d_model * x.element_size()
    return {"samples": samples, "error": error, "bytes": bytes_sent, "rows": layer.sent_rows,
            "dropped": int((~routing.keep).sum()), "counts": counts.tolist(), "threads": torch.get_num_threads()}


def benchmark_ep(config: EPConfig) -> EPResult:
    """Run the layer on `config.ep` spawned ranks (see the module docstring)."""
    from stepscope.distributed.launch import LaunchConfig, launch

    config.validate()
    launch_config = LaunchConfig(world_size=config.ep, backend=config.backend, threads=config.threads,
                                 timeout_s=config.timeout_s, deadline_s=config.timeout_s * 10)
    results = launch(_rank, config, config=launch_config)
    assert results is not None  # spawned here: the parent gets every rank's result
    slowest = {piece: [max(r["samples"][i][piece] for r in results) for i in range(config.iters)]
               for piece in PIECES}
    slowest["layer"] = [max(sum(r["samples"][i].values()) for r in results) for i in range(config.iters)]
    counts = results[0]["counts"]
    mean = sum(counts) / len(counts)
    return EPResult(config=config, pieces={piece: Stats.of(values) for piece, values in slowest.items()},
                    max_abs_error=max(r["error"] for r in results), dispatch_bytes=max(r["bytes"] for r in results),
                    dispatch_rows=sum(r["rows"] for r in results), dropped=sum(r["dropped"] for r in results),
                    load_max_over_mean=max(counts) / mean if mean else 1.0, threads=results[0]["threads"])


def run_moe_ep(config: EPConfig, out: str | os.PathLike | None = None) -> tuple[dict[str, Any], EPResult]:
    """Benchmark one point and append its `moe-ep` record to `<out>/moe-ep.jsonl` (None: not stored)."""
    from stepscope.distributed.launch.rank import resolve_backend
    from stepscope.measure.environment import torch_environment

    config.validate()
    resolve_backend(config.backend, config.ep)  # a backend this machine lacks is refused before the store exists
    store = RecordStore(out, "moe-ep").check_writable() if out is not None else None
    result = benchmark_ep(config)
    env = torch_environment("cpu" if config.backend == "gloo" else "cuda", world_size=config.ep,
                            threads=result.threads)
    # a layer whose output is wrong measured nothing worth keeping as ok
    record = make_record("moe-ep", config.record_config(), result.metrics(), env=env,
                         status="ok" if result.matches else "mismatch",
                         note=None if result.matches else result.check_line())
    if store is not None:
        store.append(record)
    return record, result
