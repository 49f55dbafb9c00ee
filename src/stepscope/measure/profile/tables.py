"""The tables of `stepscope profile`, computed from attributed work (profile_events.py).

All times are per step: the profiler's active steps are summed and divided by their number.
- categories: per phase group (forward, forward+backward, train step): time, % of the group, calls, average;
- top ops: the ops (CPU) or kernels (CUDA) with the most time in a group, with category and calls per step;
- matmul share: the fraction of profiled time in matmuls, per group side by side;
- MoE pieces (MoE models): the `moe` category split into router, dispatch, experts, combine and shared, per
  phase (forward, backward);
- timer vs profiler: per phase, the wall time of the timing harness (no profiler attached), the wall time
  of the profiled phase range, and the time the profiler saw in ops or kernels; range - ops is host
  overhead and launch gaps (Python, the dispatcher, autograd bookkeeping, idle device), range - timer the
  profiler's own cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from stepscope.measure.categories import CATEGORIES
from stepscope.measure.profile.events import (
    GROUP_TITLES,
    PHASE_GROUPS,
    PhaseRange,
    Work,
)
from stepscope.measure.stats import Stats
from stepscope.results.tables import Table


def groups_of(phases: Sequence[str]) -> list[str]:
    """The phase groups a workload has: fwd only, or fwd and fwd-bwd, or all three."""
    return [group for group, members in PHASE_GROUPS.items() if set(members) <= set(phases)]


def _in_group(work: Iterable[Work], group: str) -> list[Work]:
    members = PHASE_GROUPS[group]
    return [w for w in work if w.phase in members]


def group_seconds(work: Iterable[Work], group: str) -> float:
    return sum(w.seconds for w in _in_group(work, group))


def category_table(work: Sequence[Work], group: str, steps: int) -> Table:
    """Time per category in one phase group; every category that took time, largest first, `other` last."""
    selected = _in_group(work, group)
    total = sum(w.seconds for w in selected)
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, set[int]] = defaultdict(set)
    for w in selected:
        seconds[w.category] += w.seconds
        calls[w.category].add(w.call)
    order = sorted((c for c in CATEGORIES if c != "other" and seconds.get(c)), key=lambda c: -seconds[c])
    rows = [_time_row({"phase": group, "category": c}, seconds.get(c, 0.0), len(calls.get(c, ())), total, steps)
            for c in order + ["other"]]
    title = f"{GROUP_TITLES[group]}: {1e3 * total / steps:.4g} ms per step in ops, by category"
    return Table("profile-category", title, ("phase", "category"), rows)


def top_ops_table(work: Sequence[Work], group: str, steps: int, n: int) -> Table:
    """The `n` ops with the most time in a group (the same op in two categories is two rows)."""
    selected = _in_group(work, group)
    total = sum(w.seconds for w in selected)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], set[int]] = defaultdict(set)
    for w in selected:
        seconds[(w.op, w.category)] += w.seconds
        calls[(w.op, w.category)].add(w.call)
    top = sorted(seconds, key=lambda key: -seconds[key])[:n]
    rows = []
    for rank, (op, category) in enumerate(top, start=1):
        row = _time_row({"phase": group, "rank": rank, "op": op, "category": category}, seconds[(op, category)],
                        len(calls[(op, category)]), total, steps)
        rows.append(row)
    return Table("profile-op", f"{GROUP_TITLES[group]}: top {len(rows)} ops by time", ("phase", "rank"), rows)


def _time_row(identity: dict, seconds: float, calls: int, total: float, steps: int) -> dict:
    return {**identity, "time_ms": 1e3 * seconds / steps, "pct": 100.0 * seconds / total if total else 0.0,
            "calls_per_step": calls / steps, "avg_us": 1e6 * seconds / calls if calls else None}


def matmul_share_table(work: Sequence[Work], groups: Sequence[str], steps: int) -> Table:
    """Fraction of profiled time in matmuls (and in fused attention) per phase group, side by side."""
    rows = []
    for group in groups:
        selected = _in_group(work, group)
        total = sum(w.seconds for w in selected)
        matmul = sum(w.seconds for w in selected if w.category == "matmul")
        attention = sum(w.seconds for w in selected if w.category == "attention")
        rows.append({"phase": group, "matmul_ms": 1e3 * matmul / steps, "total_ms": 1e3 * total / steps,
                     "matmul_pct": 100.0 * matmul / total if total else 0.0,
                     "attention_pct": 100.0 * attention / total if total else 0.0})
    return Table("profile-share", "share of time in matmuls (the optimizer adds many small ops)",
                 ("phase",), rows)


MOE_PIECES = ("router", "dispatch", "experts", "combine", "shared")
"""The `stepscope.moe.<piece>` ranges of `nn.moe`, in the order a token meets them."""


def moe_table(work: Sequence[Work], steps: int) -> Table:
    """Time in each MoE piece per phase, as a share of the phase's MoE time and of all its time in ops."""
    rows = []
    for phase in ("forward", "backward"):
        selected = [w for w in work if w.phase == phase]
        total = sum(w.seconds for w in selected)
        moe = [w for w in selected if w.category == "moe"]
        moe_total = sum(w.seconds for w in moe)
        for piece in MOE_PIECES:
            part = [w for w in moe if w.piece == piece]
            if not part:
                continue
            seconds = sum(w.seconds for w in part)
            rows.append({"phase": phase, "piece": piece, "time_ms": 1e3 * seconds / steps,
                         "pct_of_moe": 100.0 * seconds / moe_total if moe_total else 0.0,
                         "pct_of_phase": 100.0 * seconds / total if total else 0.0,
                         "calls_per_step": len({w.call for w in part}) / steps})
    return Table("profile-moe", "Mixture-of-Experts pieces per step (the `moe` category split by range)",
                 ("phase", "piece"), rows)


def timer_table(work: Sequence[Work], ranges: Sequence[PhaseRange], timer: dict[str, Stats], steps: int) -> Table:
    """Per phase and for the whole step: timer (no profiler) vs profiled range vs time in ops.

    The gap is taken inside the SAME profiled steps (range wall time - time in ops), so load or drift between
    the profiled and the timed steps cannot make it negative; the profiler's own cost is shown apart
    (profiled range - timer).
    """
    rows = []
    phases = [p for p in timer if p != "step"]
    for phase in [*phases, "step"]:
        members = phases if phase == "step" else [phase]
        ops = sum(w.seconds for w in work if w.phase in members) / steps
        ranged = sum(r.seconds for r in ranges if r.phase in members) / steps
        wall = timer[phase].median
        rows.append({"phase": phase, "timer_ms": 1e3 * wall, "profiled_range_ms": 1e3 * ranged,
                     "in_ops_ms": 1e3 * ops, "gap_ms": 1e3 * (ranged - ops),
                     "gap_pct": 100.0 * (ranged - ops) / ranged if ranged else None,
                     "profiler_overhead_ms": 1e3 * (ranged - wall)})
    title = ("timer (no profiler) vs profiler per step; gap = profiled range - time in ops (host overhead, "
             "launch gaps); profiler_overhead = profiled range - timer")
    return Table("profile-timer", title, ("phase",), rows)
