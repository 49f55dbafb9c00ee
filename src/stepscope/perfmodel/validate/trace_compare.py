"""Put the measured steps of GPU traces (`stepscope trace` records) next to the prediction of the run's model,
plan and system: step time, and its split into computation and exposed communication.

The trace's split is HTA's: compute = the union of computation kernels; exposed communication = communication
kernel time not under a computation kernel; idle = GPU time with no kernel at all. The model prices the GPU's work;
a step also lasts at least the host's time to issue it (`host_ms`, measured in the trace), so the predicted step is
the longer of the two (`calibrate/trace_categories.py`: where the host is longer, the GPU idles the difference).
The model's: compute = forward, backward, recompute and optimizer work; exposed communication = the tp, cp, pp and
dp collectives it does not hide; bubble = pipeline idle.
Per rank, the median over its steps, from the records of one traced job (`one_job`). Appends one `compare` record
per rank (`source: trace`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import COMM_CAUSES, Prediction, evaluate
from stepscope.perfmodel.records import matches, parse_where
from stepscope.perfmodel.runs import DEFAULT_SYSTEM, RunRecords, SystemLike, system_of
from stepscope.results.store import DEFAULT_OUT, read_records
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan

COMPUTE_CAUSES = ("forward_compute", "backward_compute", "recompute", "optimizer")
MEASURED = ("step_ms", "compute_ms", "comm_exposed_ms", "idle_ms")


@dataclass(frozen=True)
class TraceCompareConfig:
    """Which trace records, and the run they came from (model, global workload, plan, system)."""

    model: ModelSpec
    workload: Workload
    plan: ParallelPlan
    records: tuple[str, ...] = (DEFAULT_OUT,)
    """Record files or folders holding `trace` records."""
    where: tuple[str, ...] = ()
    """Filters `FIELD=VALUE[,VALUE]` on the records' config (e.g. rank=0)."""
    system: SystemLike = DEFAULT_SYSTEM


def predicted_split(prediction: Prediction) -> dict[str, float]:
    """The prediction in the trace's terms (ms)."""
    causes = prediction.breakdown
    return {"step_ms": 1e3 * prediction.step_s,
            "compute_ms": 1e3 * sum(causes.get(c, 0.0) for c in COMPUTE_CAUSES),
            "comm_exposed_ms": 1e3 * sum(causes.get(c, 0.0) for c in COMM_CAUSES),
            "bubble_ms": 1e3 * causes.get("bubble", 0.0)}


def one_job(records: list[dict[str, Any]], gpus: int) -> list[dict[str, Any]]:
    """The step records of one traced job: a record written again for the same trace step (a rerun) replaces the
    earlier one; records of different `stepscope trace` runs, or of a job of another size than the plan's, are a
    UsageError (their medians would mix jobs)."""
    def step_of(i: int, record: dict[str, Any]) -> str:  # a job's step of a rank, however its files were named
        config = record["config"]
        if config.get("job") is not None:
            return f"{config['job']}/{config.get('rank')}/{config.get('step')}"
        return str(record.get("key") or i)

    latest = {step_of(i, r): r for i, r in enumerate(records)}
    runs: dict[str, list[dict[str, Any]]] = {}
    for record in latest.values():  # the files analysed together (`job`; older records: the command that ran)
        job = record["config"].get("job") or (record.get("env") or {}).get("command")
        runs.setdefault(str(job), []).append(record)
    if len(runs) > 1:
        files = "; ".join(", ".join(sorted({str(r["config"].get("file")) for r in group})) for group in runs.values())
        raise UsageError(f"the records hold {len(runs)} traced jobs ({files}): give one job's records, e.g. with "
                         "--where job=ID or a results folder of its own")
    kept = list(latest.values())
    sizes = {r["config"].get("stated_world_size") for r in kept} - {None}  # a size the traces state themselves
    if sizes and sizes != {gpus}:
        raise UsageError(f"the traces are of a job of {'/'.join(map(str, sorted(sizes)))} ranks but the plan has "
                         f"{gpus} GPUs")
    return kept


def measured_by_rank(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """rank -> median over its steps of step, compute, exposed communication and idle time (ms)."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_rank.setdefault(int(record["config"].get("rank", 0)), []).append(record["metrics"])
    out = {}
    for rank, rows in sorted(by_rank.items()):
        out[rank] = {"steps": len(rows), **{k: median(float(r[k]) for r in rows) for k in MEASURED}}
        hosts = [float(r["host_ms"]) for r in rows if r.get("host_ms") is not None]
        out[rank]["host_ms"] = median(hosts) if hosts else None
    return out


@dataclass(frozen=True)
class TraceCompareOutcome:
    prediction: Prediction
    measured: dict[int, dict[str, float]]
    path: Path | None = None
    rows_: list[dict[str, Any]] = field(default_factory=list)
    categories: list[dict[str, Any]] = field(default_factory=list)
    """Per rank and category (`trace_categories`): measured and predicted ms per step."""

    def rows(self) -> list[dict[str, Any]]:
        return self.rows_


def run_trace_compare(config: TraceCompareConfig, out: str | os.PathLike | None = None) -> TraceCompareOutcome:
    """Predict the traced run and put each rank's measured step next to it; one `compare` record per rank in
    `<out>/compare.jsonl` (None: none). No `trace` step record is a UsageError, before any output."""
    system = system_of(config.system)
    where = parse_where(config.where)
    steps = [r for r in read_records(*config.records)
             if r.get("kind") == "trace" and (r.get("config") or {}).get("record") == "step"
             and r.get("status") == "ok" and matches(r, where)]
    if not steps:
        raise UsageError(f"no trace step records in {', '.join(map(str, config.records))} (write them with "
                         "`stepscope trace ... --out`; a trace without ProfilerStep ranges has none)")
    config.plan.check(config.model, config.workload.batch, config.workload.seq, None)
    steps = one_job(steps, config.plan.gpus)
    prediction = evaluate(config.model, config.workload, config.plan, system)
    predicted = predicted_split(prediction)
    measured = measured_by_rank(steps)
    records = RunRecords(out, "compare")
    rows = []
    for rank, values in measured.items():
        plan = config.plan
        row: dict[str, Any] = {"rank": rank, "steps": values["steps"], "model": config.model.name,
                               "plan": f"dp{plan.dp} tp{plan.tp} pp{plan.pp} cp{plan.cp} mb{plan.micro_batch}"}
        step = max(predicted["step_ms"], values["host_ms"] or 0.0)  # the GPU cannot outrun the host
        for key in ("step_ms", "compute_ms", "comm_exposed_ms"):
            row[key.replace("_ms", "_measured_ms")] = values[key]
            row[key.replace("_ms", "_predicted_ms")] = step if key == "step_ms" else predicted[key]
        row["idle_measured_ms"] = values["idle_ms"]
        row["host_measured_ms"] = values["host_ms"]
        row["bubble_predicted_ms"] = predicted["bubble_ms"]
        row["step_error_pct"] = (100 * (step - values["step_ms"]) / values["step_ms"]
                                 if values["step_ms"] > 0 else None)  # a step of no GPU time has no error
        rows.append({k: v for k, v in row.items() if v is not None})
        records.append({"source": "trace", "rank": rank, "model": config.model.name, **config.workload.to_dict(),
                        "plan": config.plan.to_dict(),
                        "system": system.name, "model_spec": config.model.to_dict()},
                       {k: v for k, v in row.items() if k.endswith(("_ms", "_pct"))})
    from stepscope.perfmodel.calibrate.trace_categories import category_rows

    categories = category_rows(config.model, config.workload, config.plan, system, [
        r for r in read_records(*config.records) if r.get("kind") == "trace" and matches(r, where)
        and (r.get("config") or {}).get("job") in {s["config"].get("job") for s in steps}])
    return TraceCompareOutcome(prediction, measured, records.path, rows, categories)
