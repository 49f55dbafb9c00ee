"""Across the ranks of one job: which file is which rank, that they are one job, and per step the step time of every
rank, the spread, the slowest rank (the one the others waited for) and the communication time spent waiting for it.

Waiting time needs no common clock (ranks' clocks differ by more than a kernel): the i-th collective of a step is
matched across ranks, and on each rank the part of its duration above the fastest rank's duration of the same
collective is time spent waiting for a slower rank to arrive (the fastest rank arrived last and waited least).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.traces.analyze import RankAnalysis


def assign_ranks(ranks: list[RankAnalysis]) -> list[RankAnalysis]:
    """Every file's rank (from `distributedInfo`, else its place in the list), checked to be one job: one world
    size, each rank once, common step numbers. A mix is a UsageError naming two files that disagree."""
    worlds = {r.world_size for r in ranks if r.world_size is not None}
    if len(worlds) > 1:
        first = next(r for r in ranks if r.world_size is not None)
        other = next(r for r in ranks if r.world_size not in (None, first.world_size))
        raise UsageError(f"traces of different jobs: {first.path.name} has world size {first.world_size}, "
                         f"{other.path.name} {other.world_size} (give the ranks of one job)")
    known = [r for r in ranks if r.rank is not None]
    if len(ranks) > 1 and len(known) != len(ranks):
        if known:
            unknown = next(r for r in ranks if r.rank is None)
            raise UsageError(f"{unknown.path.name} names no rank while {known[0].path.name} does: traces of "
                             "different jobs? (give the ranks of one job)")
        for index, rank in enumerate(ranks):
            rank.rank = index
    seen: dict[int, RankAnalysis] = {}
    for rank in ranks:
        rank.rank = 0 if rank.rank is None else rank.rank
        if rank.rank in seen:
            raise UsageError(f"{seen[rank.rank].path.name} and {rank.path.name} are both rank {rank.rank}: traces "
                             "of different jobs, or one rank twice (give one file per rank of one job)")
        seen[rank.rank] = rank
        if rank.world_size is not None and not 0 <= rank.rank < rank.world_size:
            raise UsageError(f"{rank.path.name} is rank {rank.rank} of a job of {rank.world_size} ranks")
    stepped = [r for r in ranks if r.steps]
    if len(stepped) > 1:
        common = set.intersection(*({w.step for w in r.steps} for r in stepped))
        if not common:
            raise UsageError(f"{stepped[0].path.name} and {stepped[1].path.name} share no ProfilerStep number: "
                             "traces of different jobs (give the ranks of one job)")
    return sorted(ranks, key=lambda r: r.rank)


@dataclass(frozen=True)
class StepAcrossRanks:
    """One step number seen by every rank that has it."""

    step: int
    step_ms: dict[int, float]
    """rank -> GPU step time."""
    wait_ms: dict[int, float] | None
    """rank -> communication time waiting for a slower rank (None: the ranks' collectives do not match)."""

    @property
    def slowest(self) -> int:
        """The rank the others waited for: the one that waited least in the matched collectives (it arrived last),
        the longer step breaking a tie; without matched collectives, the rank with the longest step. A step window
        includes the time a rank spent waiting, so the longest window alone would name a waiting rank."""
        if self.wait_ms is None:
            return max(self.step_ms, key=self.step_ms.get)
        return min(self.step_ms, key=lambda r: (self.wait_ms[r], -self.step_ms[r]))

    @property
    def waiting(self) -> int | None:
        """The rank that waited longest for the slowest one; None when no rank waited longer than the slowest (or
        the collectives do not match). Never the slowest rank itself."""
        if self.wait_ms is None:
            return None
        slowest = self.slowest
        others = [r for r in self.wait_ms if r != slowest]
        if not others:
            return None
        rank = max(others, key=self.wait_ms.get)
        return rank if self.wait_ms[rank] > self.wait_ms[slowest] else None

    def row(self) -> dict[str, Any]:
        times = list(self.step_ms.values())
        middle = median(times)
        row: dict[str, Any] = {"step": self.step, "ranks": len(times), "min_ms": min(times), "median_ms": middle,
                               "max_ms": max(times), "spread_ms": max(times) - min(times),
                               "spread_pct": 100 * (max(times) - min(times)) / middle if middle else 0.0,
                               "slowest_rank": self.slowest}
        if self.wait_ms is not None:
            row["max_wait_ms"] = max(self.wait_ms.values())
            row["waiting_rank"] = self.waiting
        return row


def across_ranks(ranks: list[RankAnalysis]) -> list[StepAcrossRanks]:
    """Per step number present on two ranks or more: step time per rank, spread, slowest rank, waiting time."""
    if len(ranks) < 2:
        return []
    by_step: dict[int, dict[int, Any]] = {}
    for rank in ranks:
        for window in rank.steps:
            by_step.setdefault(window.step, {})[rank.rank] = window
    out = []
    for step, windows in sorted(by_step.items()):
        if len(windows) < 2:
            continue
        durations = [w.comm_durations for w in windows.values()]
        wait = None
        # matched position by position only where every rank issued the same collectives in the same order
        if len({w.comm_kinds for w in windows.values()}) == 1 and len(durations[0]):
            fastest = np.min(np.stack(durations), axis=0)
            wait = {r: float(np.sum(w.comm_durations - fastest)) / 1e3 for r, w in windows.items()}
        out.append(StepAcrossRanks(step, {r: w.breakdown.span_us / 1e3 for r, w in windows.items()}, wait))
    return out
