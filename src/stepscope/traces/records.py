"""The rows `stepscope trace` prints and the `trace` records it writes, from the analysed ranks.

One record kind, `trace`, whose config field `record` says what it is: `rank` (the whole trace, HTA's numbers),
`step` (one rank-step), `category` (one category of one rank-step), `collective`, `straggler` (one step across
ranks), `kernel` and `cpu_op` (the top ones of a rank), `roofline` and `roofline_total`, `collective_size`,
`critical_path` (one rank-step) and `job_critical_path` (one step across ranks). `compare` reads the `step` records
as measured steps.
"""

from __future__ import annotations

import hashlib
from typing import Any

from stepscope.measure.categories import CATEGORIES
from stepscope.traces.analyze import RankAnalysis, Window
from stepscope.traces.critical_path_ranks import JobStepPath
from stepscope.traces.ranks import StepAcrossRanks
from stepscope.traces.roofline import totals

STEP_COLUMNS = ["rank", "step", "step_ms", "cpu_step_ms", "host_ms", "idle_pct", "compute_pct", "non_compute_pct",
                "comm_ms", "comm_exposed_ms", "comm_overlap_pct", "kernels", "launch_bound_kernels", "launch_bound",
                "queue_mean", "queue_max", "launch_gap_us"]
CATEGORY_COLUMNS = ["rank", "step", *[f"{c.replace(' ', '_')}_pct" for c in CATEGORIES]]


def _label(window: Window) -> Any:
    return "all" if window.step is None else window.step


def step_rows(ranks: list[RankAnalysis], launch_bound_share: float) -> list[dict[str, Any]]:
    """Per rank: each step, then the rank's totals (`all`: HTA's temporal breakdown and overlap)."""
    rows = []
    for rank in ranks:
        for window in [*rank.steps, rank.total]:
            rows.append({"rank": rank.rank, "step": _label(window), **window.metrics(launch_bound_share)})
    return rows


def collective_rows(ranks: list[RankAnalysis]) -> list[dict[str, Any]]:
    rows = []
    for rank in ranks:
        for window in [*rank.steps, rank.total]:
            for kind, (calls, total) in sorted(window.collectives.items()):
                rows.append({"rank": rank.rank, "step": _label(window), "collective": kind, "calls": int(calls),
                             "total_ms": total / 1e3, "mean_us": total / calls})
    return rows


def top_rows(ranks: list[RankAnalysis], what: str) -> list[dict[str, Any]]:
    """`kernels` or `cpu_ops`: each rank's top entries by total time."""
    return [{"rank": rank.rank, **row} for rank in ranks
            for row in (rank.top_kernels if what == "kernels" else rank.top_cpu_ops)]


def straggler_rows(steps: list[StepAcrossRanks]) -> list[dict[str, Any]]:
    return [step.row() for step in steps]


def rank_step_ms(steps: list[StepAcrossRanks]) -> list[dict[str, Any]]:
    """One row per step, one column per rank: the step time each rank saw."""
    return [{"step": s.step, **{f"rank{r}_ms": ms for r, ms in sorted(s.step_ms.items())}} for s in steps]


ROOFLINE_COLUMNS = ["rank", "op", "shape", "precision", "calls", "time_ms", "GFLOP_per_call", "TFLOPps", "peak_pct",
                    "GBps", "bandwidth_pct", "bound"]


def roofline_rows(ranks: list[RankAnalysis], top: int) -> list[dict[str, Any]]:
    """Per rank, its `top` (op, shape, precision) by GPU time."""
    rows = []
    for rank in ranks:
        for row in rank.roofline[:top]:
            rows.append({"rank": rank.rank, "op": row.op, "shape": row.cost.shape, "precision": row.precision,
                         **row.metrics(rank.peaks)})
    return [{c: row.get(c) for c in ROOFLINE_COLUMNS} for row in rows]


def roofline_totals(ranks: list[RankAnalysis]) -> list[dict[str, Any]]:
    """Per rank and op family (`gemm`: the matmul family's total line): summed FLOPs and bytes over summed time."""
    return [{"rank": rank.rank, **line} for rank in ranks for line in totals(rank.roofline, rank.peaks)]


def critical_path_rows(ranks: list[RankAnalysis]) -> list[dict[str, Any]]:
    """Per rank-step: the critical path's length, what bounds it, and its ms per category."""
    rows = []
    for rank in ranks:
        for path in rank.critical_path:
            rows.append({"rank": rank.rank, "step": path.step, **path.metrics(),
                         **{f"{c.replace(' ', '_')}_ms": ms for c, ms in sorted(path.categories.items())}})
    return rows


def job_path_rows(paths: list[JobStepPath]) -> list[dict[str, Any]]:
    """Per step across ranks: the path's length, what bounds it, the rank whose work set most of it, ms per
    category."""
    return [path.row() for path in paths]


def build_records(ranks: list[RankAnalysis], steps: list[StepAcrossRanks], launch_bound_share: float,
                  paths: list[JobStepPath] = ()) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(config, metrics) of every record, in the order they are written."""
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    files = sorted(str(r.path) for r in ranks)
    # the traces analysed together are one job (`compare --kind trace` keeps one job's records apart from another's);
    # resolved paths: the same files named from another folder are the same job
    job = hashlib.sha1("\n".join(sorted(str(r.path.resolve()) for r in ranks)).encode()).hexdigest()[:12]
    for rank in ranks:
        # `world_size` falls back to the files given; `stated_world_size` is the trace's own (None: it names none)
        base = {"file": str(rank.path), "job": job, "rank": rank.rank, "world_size": rank.world_size or len(ranks),
                "stated_world_size": rank.world_size, "device": rank.device, "shapes": rank.shapes,
                "peaks": rank.peaks.source if rank.peaks else None}
        out.append(({"record": "rank", **base, "step": "all", "events": rank.events},
                    rank.total.metrics(launch_bound_share)))
        for window in rank.steps:
            out.append(({"record": "step", **base, "step": window.step}, window.metrics(launch_bound_share)))
        for window in [*rank.steps, rank.total]:
            total = sum(window.categories.values()) or 1.0
            for category, us in window.categories.items():
                out.append(({"record": "category", **base, "step": _label(window), "category": category},
                            {"time_ms": us / 1e3, "kernel_time_pct": 100 * us / total}))
            for kind, (calls, us) in window.collectives.items():
                out.append(({"record": "collective", **base, "step": _label(window), "collective": kind},
                            {"calls": int(calls), "time_ms": us / 1e3}))
        for row in rank.top_kernels:
            out.append(({"record": "kernel", **base, "kernel": row["kernel"], "category": row["category"]},
                        {k: v for k, v in row.items() if k not in ("kernel", "category")}))
        for row in rank.roofline:
            out.append(({"record": "roofline", **base, "op": row.op, "shape": row.cost.shape,
                         "family": row.cost.family, "precision": row.precision}, row.metrics(rank.peaks)))
        for line in totals(rank.roofline, rank.peaks):
            out.append(({"record": "roofline_total", **base, "family": line["family"],
                         "precision": line["precision"]}, {k: v for k, v in line.items()
                                                           if k not in ("family", "precision")}))
        for row in rank.collective_sizes:
            out.append(({"record": "collective_size", **base, **{k: row[k] for k in ("collective", "bytes",
                                                                                         "group_size")}},
                        {k: row[k] for k in ("calls", "total_us", "mean_us")}))
        for path in rank.critical_path:
            out.append(({"record": "critical_path", **base, "step": path.step},
                        {**path.metrics(), **{f"{c.replace(' ', '_')}_ms": ms for c, ms in path.categories.items()}}))
        for row in rank.top_cpu_ops:
            out.append(({"record": "cpu_op", **base, "cpu_op": row["cpu_op"]},
                        {k: v for k, v in row.items() if k != "cpu_op"}))
    world = ranks[0].world_size or len(ranks)
    for step in steps:
        row = step.row()
        out.append(({"record": "straggler", "files": files, "world_size": world, "step": step.step},
                    {k: v for k, v in row.items() if k != "step"}))
    for path in paths:
        row = path.row()
        out.append(({"record": "job_critical_path", "files": files, "job": job, "world_size": world,
                     "step": path.step}, {k: v for k, v in row.items() if k != "step"}))
    return out
