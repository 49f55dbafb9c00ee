"""Predict training steps: `evaluate_many` for any number of plans as arrays, `evaluate` for one plan, which is
the same computation on arrays of one.

`evaluate_many(spec, workload, system, candidates)` works in two levels: `terms.group_terms` computes what does
not depend on a plan's ZeRO stage or recompute mode (op times, collectives, stages, parameters), and
`step.assemble` what does. With `group_size=k` the caller promises that each run of k consecutive candidates
differs only in ZeRO stage and recompute mode (what a search produces): the terms are then computed once per run
and broadcast over its members, which is what lets a search evaluate millions of plans per second.

The workload's `batch` is the GLOBAL batch (all data-parallel replicas together); `mode` fwd predicts a forward
pass, fwd-bwd forward + backward, train adds the optimizer step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.layout import group_layout
from stepscope.perfmodel.model.ops import activation_precision
from stepscope.perfmodel.model.schedule import DEFAULT_BUCKET_MIB
from stepscope.perfmodel.model.step import CAUSES, PHASES, GiB, assemble
from stepscope.perfmodel.model.terms import STAGES, group_terms
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import SystemSpec

COMM_CAUSES = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")  # the breakdown's exposed communication


def evaluate_many(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates, *, group_size: int = 1,
                  bucket_cap_MiB: float = DEFAULT_BUCKET_MIB,
                  bucket_elements: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """Every output of a prediction for every candidate (arrays, one element per plan). `bucket_elements`: a
    gradient-bucket layout every plan shares (elements per bucket in launch order); else buckets of
    `bucket_cap_MiB`."""
    n = len(c)
    if n % group_size:
        raise ValueError(f"{n} candidates do not split into groups of {group_size}")
    representatives = c if group_size == 1 else c.subset(slice(None, None, group_size))

    def terms_of(part: Candidates, flash: bool):
        return group_terms(spec, workload, system, part, flash, bucket_elements=bucket_elements,
                           bucket_cap_MiB=bucket_cap_MiB)

    flash = representatives.flash_attention
    if flash.all() or not flash.any():  # one attention kind: one list of ops
        terms = terms_of(representatives, bool(flash[0]))
    else:  # each kind has its own ops; the terms are merged plan by plan
        fused, unfused = terms_of(representatives.subset(flash), True), terms_of(representatives.subset(~flash), False)
        terms = _merge(flash, fused, unfused)
    zero, rec = c.zero.reshape(-1, group_size), c.recompute.reshape(-1, group_size)
    grid = _member_grid(zero, rec)
    if grid is None:  # groups on axis 0, the members of a group (ZeRO stage x recompute mode) on axis 1
        shape = zero.shape
        terms = _map_arrays(terms, lambda a: a.reshape(-1, 1))
    else:  # groups on axis 0, ZeRO stages on axis 1, recompute modes on axis 2
        zero, rec = grid
        shape = (len(representatives), zero.shape[1], rec.shape[2])
        terms = _map_arrays(terms, lambda a: a.reshape(-1, 1, 1))
    out = assemble(spec, workload, system, c, terms, zero, rec)
    return {name: np.broadcast_to(value, shape).reshape(n) for name, value in out.items()}


def _map_arrays(value: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any:
    """`value` (dataclasses, tuples, dicts of arrays and plain numbers) with `fn` applied to every array of at
    least one dimension."""
    if isinstance(value, np.ndarray):
        return fn(value) if value.ndim else value
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _map_arrays(getattr(value, f.name), fn)
                                             for f in dataclasses.fields(value)})
    if isinstance(value, tuple):
        return tuple(_map_arrays(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_arrays(v, fn) for k, v in value.items()}
    return value


def _merge(mask: np.ndarray, where_true: Any, where_false: Any) -> Any:
    """Terms of all plans from those of the plans where `mask` holds and of the others (same structure)."""
    if dataclasses.is_dataclass(where_true):
        return dataclasses.replace(where_true, **{f.name: _merge(mask, getattr(where_true, f.name),
                                                                 getattr(where_false, f.name))
                                                  for f in dataclasses.fields(where_true)})
    if isinstance(where_true, tuple):
        return tuple(_merge(mask, a, b) for a, b in zip(where_true, where_false, strict=True))
    if isinstance(where_true, dict):
        return {k: _merge(mask, where_true[k], where_false[k]) for k in where_true}
    if where_true is None or isinstance(where_true, str):
        return where_true
    out = np.empty(len(mask), dtype=np.result_type(where_true, where_false))
    out[mask], out[~mask] = where_true, where_false
    return out


def _member_grid(zero: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where every group's members are the same ZeRO stages x recompute modes, the recompute mode varying
    fastest (what a search produces): the stages as a (1, z, 1) array and the modes as (1, 1, r), else None.
    Broadcasting then computes what depends on the recompute mode alone (the pipeline stages and their pace)
    once per mode instead of once per member, and what depends on neither once per group; every element is
    still the same float operations on the same values, so the outputs are identical."""
    first_z, first_r = zero[0], rec[0]
    if not ((zero == first_z).all() and (rec == first_r).all()):
        return None
    modes = int(np.argmax(first_z != first_z[0])) or len(first_z)  # members before the stage first changes
    if len(first_z) % modes:
        return None
    z, r = first_z.reshape(-1, modes), first_r.reshape(-1, modes)
    if not ((z == z[:, :1]).all() and (r == r[:1]).all()):
        return None
    return z[:, 0].reshape(1, -1, 1), r[0].reshape(1, 1, -1)


@dataclass(frozen=True)
class Memory:
    """Peak bytes per GPU on the fullest pipeline stage."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    capacity: float
    """Bytes the model may use on the device (capacity minus the reserve)."""

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def feasible(self) -> bool:
        return self.total <= self.capacity

    def GiB(self) -> dict[str, float]:
        return {"weights_GiB": self.weights / GiB, "grads_GiB": self.grads / GiB,
                "optimizer_GiB": self.optimizer / GiB, "activations_GiB": self.activations / GiB,
                "mem_GiB": self.total / GiB, "capacity_GiB": self.capacity / GiB}


@dataclass(frozen=True)
class Prediction:
    """A predicted training step: time by phase and by cause, FLOPs, memory."""

    model: ModelSpec
    workload: Workload
    plan: ParallelPlan
    system: str
    micro_batches: int
    phases: dict[str, float]
    """Seconds per step: forward, backward (with exposed gradient reduction), optimizer, bubble."""
    breakdown: dict[str, float]
    """Seconds per step by cause; sums to step_s."""
    model_flops: float
    """MFU FLOPs of the step over all GPUs."""
    hardware_flops: float
    """model_flops plus recomputation."""
    peak_flops: float
    """Matrix peak of one GPU in the workload's (16-bit for fp8) precision."""
    memory: Memory
    extras: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    """The step time as the evaluator sums it (the phases in ms, then / 1e3: what a search reports for the same
    plan, to the last bit); None: the sum of `phases`."""

    @property
    def step_s(self) -> float:
        return sum(self.phases.values()) if self.seconds is None else self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.workload.batch * self.workload.seq / self.step_s

    @property
    def mfu_pct(self) -> float:
        return 100.0 * self.model_flops / (self.step_s * self.plan.gpus * self.peak_flops)

    @property
    def hfu_pct(self) -> float:
        return 100.0 * self.hardware_flops / (self.step_s * self.plan.gpus * self.peak_flops)

    def metrics(self) -> dict[str, Any]:
        """Record metrics, units in the names."""
        out: dict[str, Any] = {"step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "mfu_pct": self.mfu_pct,
                               "hfu_pct": self.hfu_pct, "micro_batches": self.micro_batches,
                               "TFLOPps_per_gpu": self.model_flops / self.step_s / self.plan.gpus / 1e12,
                               "feasible": self.memory.feasible}
        out.update({f"{phase}_ms": 1e3 * s for phase, s in self.phases.items()})
        out.update({f"{cause}_s": s for cause, s in self.breakdown.items()})
        out.update(self.memory.GiB())
        return out


def evaluate(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec, *,
             bucket_elements: Sequence[float] | None = None, bucket_cap_MiB: float = DEFAULT_BUCKET_MIB) -> Prediction:
    """Predict one step of `plan`: `evaluate_many` on an array of one. `bucket_elements` is a gradient-bucket
    layout (elements per bucket, in launch order; e.g. from the DDP bucket planner); without it buckets of
    `bucket_cap_MiB` are assumed."""
    workload.check_fits(spec.context_length)
    plan.check(spec, workload.batch, workload.seq)
    c = Candidates.from_plans([plan])
    out = {k: v[0].item() for k, v in evaluate_many(spec, workload, system, c, bucket_cap_MiB=bucket_cap_MiB,
                                                      bucket_elements=bucket_elements).items()}
    memory = Memory(*(out[f"{part}_GiB"] * GiB for part in ("weights", "grads", "optimizer", "activations")),
                    capacity=system.accelerator.capacity_bytes)
    layout = {k: int(np.asarray(v)[0]) for k, v in group_layout(c, system.network.domain_size).items()}
    peak = system.accelerator.matrix_peak(activation_precision(workload.precision))
    return Prediction(model=spec, workload=workload, plan=plan, system=system.name,
                      micro_batches=plan.micro_batches(workload.batch),
                      phases={phase: out[f"{phase}_ms"] / 1e3 for phase in PHASES},
                      breakdown={cause: out[f"{cause}_s"] for cause in CAUSES}, model_flops=out["model_flops"],
                      hardware_flops=out["hardware_flops"], peak_flops=peak, memory=memory,
                      extras={"layout": layout, "params_per_gpu": out["params_per_gpu"],
                              "pace_stage": _stage_name(plan, int(out["pace_stage"]))}, seconds=out["step_s"])


def _stage_name(plan: ParallelPlan, index: int) -> str:
    return "only" if plan.pp == 1 else STAGES[index]
