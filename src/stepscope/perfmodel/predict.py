"""`run_predict`: predict the training step of given parallel plans on a system, and append one `predict`
record per plan (step time, throughput, MFU, memory, the breakdown by cause; optionally the per-layer table)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.perfmodel.model.evaluate import Prediction, evaluate
from stepscope.perfmodel.model.layers import per_layer_rows
from stepscope.perfmodel.model.schedule import DEFAULT_BUCKET_MIB
from stepscope.perfmodel.model.tensors import gradient_tensors
from stepscope.perfmodel.runs import DEFAULT_SYSTEM, RunRecords, SystemLike, check_choice, system_of
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.buckets import bucket_numels, plan_buckets
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.stack import load_stack
from stepscope.spec.system import SystemSpec

BUCKET_RULES = ("size", "torch", "strict")


@dataclass(frozen=True)
class PredictPoint:
    """One plan to predict: a model, its global-batch workload and its parallel plan."""

    model: ModelSpec
    workload: Workload
    plan: ParallelPlan


@dataclass(frozen=True)
class PredictConfig:
    """A `predict` run: the plans and what they share."""

    points: tuple[PredictPoint, ...]
    """The plans to predict, one record each."""
    system: SystemLike = DEFAULT_SYSTEM
    """System preset, TOML file or SystemSpec."""
    bucket_MiB: float = DEFAULT_BUCKET_MIB
    """Gradient bucket size for the overlap rule."""
    buckets: str = "size"
    """Gradient bucket layout: size (buckets of bucket_MiB, an estimate), or torch|strict (the DDP bucket
    planner's layout of the model's gradients, `stepscope.spec.buckets`)."""
    per_layer: bool = False
    """Also compute the per-op table of one layer."""

    def check(self) -> None:
        """UsageError for settings no plan can use."""
        # a floor at DDP's first bucket (1 MiB) keeps the bucket list of a large model a list, not millions
        if not 1 <= self.bucket_MiB < math.inf:
            raise UsageError(f"--bucket-MiB must be a finite number of at least 1 (DDP's first bucket; its "
                             f"default is 25), got {self.bucket_MiB:g}")
        check_choice(self.buckets, BUCKET_RULES)


@dataclass(frozen=True)
class PredictedStep:
    """One predicted plan and its tables."""

    point: PredictPoint
    system: SystemSpec
    prediction: Prediction
    per_layer: list[dict[str, Any]] | None = None
    """The per-layer table (with `per_layer`): one GPU, one micro-batch; blocks summed over a stage's layers."""

    def title(self) -> str:
        plan, workload = self.point.plan, self.point.workload
        return (f"{self.point.model.name} on {plan.gpus} x {self.system.name}: {plan.describe()}, global batch "
                f"{workload.batch}, seq {workload.seq}, {workload.precision} {workload.mode}")

    def totals(self) -> dict[str, Any]:
        p, gpus = self.prediction, self.point.plan.gpus
        return {"step_s": p.step_s, "tokens_per_s": p.tokens_per_s, "mfu_pct": p.mfu_pct, "hfu_pct": p.hfu_pct,
                "TFLOPps_per_gpu": p.model_flops / p.step_s / gpus / 1e12, "micro_batches": p.micro_batches,
                "mem_GiB": p.memory.total / 2**30, "capacity_GiB": p.memory.capacity / 2**30,
                "fits": p.memory.feasible}

    def breakdown_rows(self) -> list[dict[str, Any]]:
        """Where the step goes: seconds and share per cause."""
        p = self.prediction
        return [{"cause": cause, "seconds": s, "share_pct": 100 * s / p.step_s}
                for cause, s in p.breakdown.items() if s > 0]

    def memory_rows(self) -> list[dict[str, Any]]:
        """Memory per GPU by part."""
        return [{"part": k.removesuffix("_GiB"), "GiB": v} for k, v in self.prediction.memory.GiB().items()
                if k != "mem_GiB"]


@dataclass(frozen=True)
class PredictOutcome:
    steps: list[PredictedStep] = field(default_factory=list)
    path: Path | None = None
    """The records file (None: no records were written)."""


def run_predict(config: PredictConfig, out: str | os.PathLike | None = None) -> PredictOutcome:
    """Predict every plan of `config` and append one `predict` record each to `<out>/predict.jsonl` (None: no
    records). Every plan, precision and output is checked before the first prediction."""
    config.check()
    system = system_of(config.system)
    for point in config.points:
        point.workload.check_fits(point.model.context_length)
        point.plan.check(point.model, point.workload.batch, point.workload.seq)
        if config.buckets != "size" and load_stack(point.plan.stack).data_parallel != "ddp":
            raise UsageError(f"--buckets {config.buckets} lays out PyTorch DDP's buckets; the stack "
                             f"{point.plan.stack} buckets its gradients its own way (use --stack pytorch-ddp)")
        system.accelerator.matrix_peak(point.workload.precision)  # the precision must exist on the system
    records = RunRecords(out, "predict")
    steps = []
    for point in config.points:
        spec, workload, plan = point.model, point.workload, point.plan
        layout = None
        if config.buckets != "size":  # the planner is pure Python; the model only receives bucket sizes
            layout = bucket_numels(plan_buckets(gradient_tensors(spec, workload, plan), cap_mb=config.bucket_MiB,
                                                rule=config.buckets))
        prediction = evaluate(spec, workload, plan, system, bucket_cap_MiB=config.bucket_MiB, bucket_elements=layout)
        per_layer = per_layer_rows(spec, workload, plan, system) if config.per_layer else None
        records.append({"model": spec.name, "model_spec": spec.to_dict(), **workload.to_dict(), "plan": plan.to_dict(),
                        "system": system.name, "gpus": plan.gpus, "bucket_MiB": config.bucket_MiB,
                        "buckets": config.buckets}, prediction.metrics())
        steps.append(PredictedStep(point, system, prediction, per_layer))
    return PredictOutcome(steps, records.path)
