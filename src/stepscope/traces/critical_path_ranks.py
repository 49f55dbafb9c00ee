"""The critical path of a step across ranks: at each collective the step waits for the rank that arrived last.

No common clock is needed (ranks' clocks differ by more than a kernel): a collective ends on every rank when the
last rank's data has arrived, so the ends of the i-th collective of a step on all ranks are one moment, and they
cut every rank's step into the same segments. In segment i a rank r takes its arrival gap a(r, i) (from the end of
collective i−1, the first from its step's CPU start, to the start of collective i: its own work, found by its
single-rank walk, `traces/critical_path.py`); the collective then runs for its transfer time, the shortest duration
any rank saw (the rank that arrived last waited least: the others' longer durations are waiting). So

    path(step) = Σ_i [ max_r a(r, i) + min_r d(r, i) ] + max_r t(r)

with d the collective's duration and t the tail after the last collective (to the rank's last GPU end). Each
segment's time is the categories of the rank that set it (the latest to arrive; the lowest rank on a tie), the
transfer is `communication`, the tail the slowest tail's. Under these rules every rank's step (CPU start to last
GPU end) equals Σ_i [max_r a(r, i) + min_r d(r, i)] + t(r), so the path is the longest rank's step, now split into
whose work set it.

Steps are matched by number; a step counts where two ranks or more have it and their collectives agree in kind and
order (as for the waiting time, `traces/ranks.py`); otherwise it has no path across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.traces.analyze import RankAnalysis
from stepscope.traces.critical_path import Segment

TRANSFER = "communication"


@dataclass(frozen=True)
class JobStepPath:
    """The critical path of one step across ranks (see the module docstring)."""

    step: int
    ranks: int
    path_ms: float
    categories: dict[str, float]
    """ms per category on the path (a segment's: its latest rank's; transfers: `communication`)."""
    set_by: dict[int, float]
    """rank -> ms of the path its own work set (arrival gaps and the tail it was latest in)."""

    def row(self) -> dict[str, Any]:
        total = self.path_ms or 1.0
        top = max(self.set_by, key=lambda r: (self.set_by[r], -r)) if self.set_by else None
        return {"step": self.step, "ranks": self.ranks, "path_ms": self.path_ms,
                "bound_by": max(self.categories, key=self.categories.get) if self.categories else "",
                "slowest_rank": top, "slowest_rank_pct": 100 * self.set_by.get(top, 0.0) / total,
                **{f"{c.replace(' ', '_')}_ms": ms for c, ms in sorted(self.categories.items())}}


def job_paths(ranks: list[RankAnalysis]) -> list[JobStepPath]:
    """The path across ranks of every step two ranks or more share with matching collectives."""
    if len(ranks) < 2:
        return []
    by_step: dict[int, dict[int, tuple[Segment, ...]]] = {}
    for rank in ranks:
        for path in rank.critical_path:
            if path.segments:
                by_step.setdefault(path.step, {})[rank.rank] = path.segments
    out = []
    for step, segments in sorted(by_step.items()):
        if len(segments) >= 2 and len({tuple(s.kind for s in seg) for seg in segments.values()}) == 1:
            out.append(step_path(step, segments))
    return out


def step_path(step: int, by_rank: dict[int, tuple[Segment, ...]]) -> JobStepPath:
    """One step's path from each rank's segments (the same collectives in the same order on every rank)."""
    categories: dict[str, float] = {}
    set_by: dict[int, float] = {}
    total = 0.0
    ranks = sorted(by_rank)
    for i in range(len(by_rank[ranks[0]])):
        latest = max(ranks, key=lambda r: (by_rank[r][i].gap_us, -r))
        segment = by_rank[latest][i]
        transfer = min(by_rank[r][i].duration_us for r in ranks)
        total += segment.gap_us + transfer
        set_by[latest] = set_by.get(latest, 0.0) + segment.gap_us / 1e3
        for category, us in segment.categories.items():
            categories[category] = categories.get(category, 0.0) + us / 1e3
        if transfer > 0:
            categories[TRANSFER] = categories.get(TRANSFER, 0.0) + transfer / 1e3
    return JobStepPath(step, len(ranks), total / 1e3, categories, set_by)
