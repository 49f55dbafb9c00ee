"""`run_plan`: search every valid parallel plan of one model on N GPUs (`search`), and append one `plan` record
per plan of the top k feasible ones, best first, with the accounting of the search."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.runs import DEFAULT_SYSTEM, RunRecords, SystemLike, system_of
from stepscope.perfmodel.search.allocator import keep_freed_memory
from stepscope.perfmodel.search.pool import available_cpus
from stepscope.perfmodel.search.search import MEMORY_RULE, SearchResult, SearchSpace, search
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.system import SystemSpec


@dataclass(frozen=True)
class PlanConfig:
    """A plan search: the model, its global-batch workload, the GPUs, and where to look."""

    model: ModelSpec
    workload: Workload
    """The step over all replicas (`batch` is the global batch)."""
    gpus: int
    """GPUs every plan uses."""
    system: SystemLike = DEFAULT_SYSTEM
    """System preset, TOML file or SystemSpec."""
    space: SearchSpace = field(default_factory=SearchSpace)
    """The values each plan dimension may take."""
    top: int = 10
    """How many of the best feasible plans to keep."""
    workers: int | None = None
    """Evaluation processes (`search_pool`); None: one per CPU this process may use. The plans found do not
    depend on it."""

    def check(self) -> None:
        for name in ("gpus", "top", "workers"):
            value = getattr(self, name)
            if name == "workers" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class PlanOutcome:
    """The search, its best plans and the rows that show them."""

    config: PlanConfig
    system: SystemSpec
    result: SearchResult
    path: Path | None = None
    """The records file (None: no records were written)."""

    def summary(self) -> str:
        """One line: what was searched, how fast, how many plans fit."""
        r, w, workers = self.result, self.config.workload, self.result.workers
        return (f"{self.config.model.name} on {self.config.gpus} x {self.system.name}, global batch {w.batch}, seq "
                f"{w.seq}, {w.precision}: {r.enumerated:,} candidates, {r.enumerated - r.evaluated:,} rejected by the "
                f"plan rules, evaluated {r.evaluated:,} in {r.seconds:.2f} s "
                f"({r.configs_per_s:,.0f} configs/s; enumeration {r.enumerate_s:.2f} s, evaluation "
                f"{r.evaluate_s:.2f} s in {workers} process{'es' if workers > 1 else ''}); "
                f"{r.feasible:,} fit in memory")

    def rejected_rows(self) -> list[dict[str, Any]]:
        """Per rule in the order they are checked (memory last): the candidates it rejected first (no earlier rule
        did; with the feasible ones they add up to all the candidates), every candidate breaking it, and why one
        candidate it rejected first was rejected."""
        r = self.result
        order = [rule for rule in r.breaking if rule != MEMORY_RULE] + [MEMORY_RULE]
        return [{"rule": rule, "rejected": r.rejected.get(rule, 0), "breaking": r.breaking[rule],
                 "example": r.examples.get(rule, "")} for rule in order if rule in r.breaking]

    def rows(self) -> list[dict[str, Any]]:
        """The top plans, best first, with where their step goes."""
        rows = []
        for rank, (plan, m) in enumerate(self.result.top, 1):
            comm = m["tp_comm_s"] + m["cp_comm_s"] + m["ep_comm_s"] + m["pp_comm_s"] + m["dp_comm_s"]
            compute = m["forward_compute_s"] + m["backward_compute_s"] + m["recompute_s"]
            rows.append({"rank": rank, "plan": plan.describe(), "placement": ",".join(plan.placement),
                         "tokens_per_s": m["tokens_per_s"], "step_s": m["step_s"], "mfu_pct": m["mfu_pct"],
                         "mem_GiB": m["mem_GiB"], "compute_pct": 100 * compute / m["step_s"],
                         "comm_pct": 100 * comm / m["step_s"], "bubble_pct": 100 * m["bubble_s"] / m["step_s"],
                         "equivalent": m["equivalent_plans"]})
        return rows


def run_plan(config: PlanConfig, out: str | os.PathLike | None = None, *,
             progress: Callable[[int, int], None] | None = None) -> PlanOutcome:
    """Search `config` and append a `plan` record per top plan to `<out>/plan.jsonl` (None: no records).
    `progress(done, total)` follows the evaluation. No feasible plan: an outcome with an empty top (and no
    records); `result.why_none()` says which rule left none."""
    config.check()
    spec, workload = config.model, config.workload
    system = system_of(config.system)
    workload.check_fits(spec.context_length)
    system.accelerator.matrix_peak(workload.precision)  # the precision must exist on the system
    records = RunRecords(out, "plan")
    # process-wide, so here in the command's function rather than in `search`, which library users may call
    keep_freed_memory()  # the search chunks' temporaries reused, not re-mapped (allocator.py)
    result = search(spec, workload, system, config.gpus, config.space, top_k=config.top,
                    workers=config.workers or available_cpus(),
                    progress=progress)
    for rank, (plan, m) in enumerate(result.top, 1):
        records.append({"model": spec.name, "model_spec": spec.to_dict(), **workload.to_dict(), "gpus": config.gpus,
                        "system": system.name, "rank": rank, "plan": plan.to_dict()},
                       {**{k: v for k, v in m.items() if k != "feasible"}, "search_evaluated": result.evaluated,
                        "search_feasible": result.feasible, "search_s": result.seconds,
                        "search_configs_per_s": result.configs_per_s})
    return PlanOutcome(config, system, result, records.path)
