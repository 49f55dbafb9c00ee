"""Read stepscope's measured records (step, attention, comm) as typed points the model can predict.

This is the only place where the measurement side's record layout meets the performance model; it reads
JSON (no torch). Records that are not `ok`, or lack the fields a point needs, are skipped and counted.
- step: config `model_spec`, batch, seq, precision, mode, attention; metrics `<phase>_ms_median`,
  `gemm_TFLOPps` (the host's large-GEMM rate); env `cpu_model` / `device_name`, threads.
- attention (`stepscope attention`): config batch, heads, seq, dim (or head_dim), dtype (or precision),
  causal, impl (or backend); metrics `fwd_ms_median` (and `bwd_ms_median` when measured).
- comm (`stepscope comm`): the fit records (config `"record": "fit"`, op, world_size, backend) with metrics
  `alpha_us`, `beta_GBps`, `bus_factor`: t(S) = α + bus_factor·S/β, S in the nccl-tests convention
  (per-rank buffer for all-reduce, total size for reduce-scatter / all-gather). Point records are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from stepscope.errors import UsageError
from stepscope.results.store import read_records
from stepscope.spec import ModelSpec, Workload

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class StepPoint:
    """A measured single-process step: what ran and how long each phase took (seconds, median)."""

    model: ModelSpec
    workload: Workload
    attention: str
    phases: dict[str, float]
    gemm_flops_per_s: float | None
    host: str
    threads: int | None
    records: int = 1
    """How many records were merged (repeated measurements of the same configuration: median)."""

    @property
    def fused_attention(self) -> bool:
        return self.attention != "naive"

    def label(self) -> str:
        spec = self.model
        return (f"{spec.name} L{spec.n_layers} d{spec.d_model} b{self.workload.batch} s{self.workload.seq} "
                f"{self.workload.mode} {self.workload.precision}")


@dataclass(frozen=True)
class AttentionPoint:
    """A measured attention kernel: q, k, v of (batch, heads, seq, head_dim)."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    precision: str
    backend: str
    causal: bool
    forward_s: float
    backward_s: float | None


@dataclass(frozen=True)
class CommPoint:
    """An α–β fit of one collective: t(S) = alpha + bus_factor·S/beta."""

    op: str
    world_size: int
    backend: str
    alpha_us: float
    beta_GBps: float
    bus_factor: float = 1.0


@dataclass
class RecordSet:
    """Measured points by kind, plus what was skipped and why."""

    steps: list[StepPoint] = field(default_factory=list)
    attention: list[AttentionPoint] = field(default_factory=list)
    comm: list[CommPoint] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def parse_where(items: Sequence[str]) -> list[tuple[str, set[str]]]:
    """`["model_spec.n_layers=3", "seq=128,256"]` -> [(path, allowed values as text)]."""
    out = []
    for item in items:
        path, sep, values = item.partition("=")
        if not sep or not path or not values:
            raise UsageError(f"malformed filter {item!r} (expected FIELD=VALUE[,VALUE], e.g. model_spec.n_layers=3)")
        out.append((path.strip(), {v.strip() for v in values.split(",")}))
    return out


def matches(record: dict[str, Any], where: Sequence[tuple[str, set[str]]]) -> bool:
    """True when every filter's config field (dotted path) has one of the allowed values."""
    for path, allowed in where:
        value = _get(record.get("config") or {}, path)
        if value is None or str(value) not in allowed:
            return False
    return True


def load_records(paths: Iterable[str | Path], where: Sequence[tuple[str, set[str]]] = ()) -> RecordSet:
    """Every step / attention / comm record under `paths` (files or folders) that passes the filters."""
    out = RecordSet()
    raw: list[dict[str, Any]] = []
    for path in paths:
        raw.extend(read_records(path))
    grouped: dict[str, list[dict[str, Any]]] = {}
    for record in raw:
        if record.get("status") != "ok":
            out.skip(f"{record.get('kind')} record with status {record.get('status')}")
            continue
        if not matches(record, where):
            out.skip("filtered out")
            continue
        kind = record.get("kind")
        if kind == "step":
            key = record.get("key")
            grouped.setdefault(key if isinstance(key, str) else str(id(record)), []).append(record)
        elif kind == "attention":
            _attention(record, out)
        elif kind == "comm":
            _comm(record, out)
        else:
            out.skip(f"{kind} record (not used)")
    for records in grouped.values():
        _step(records, out)
    return out


def _step(records: list[dict[str, Any]], out: RecordSet) -> None:
    first = records[0]
    config, env = (first.get(part) if isinstance(first.get(part), dict) else {} for part in ("config", "env"))
    try:
        model = ModelSpec(**config["model_spec"])
        workload = Workload(batch=_whole(config["batch"]), seq=_whole(config["seq"]), precision=config["precision"],
                            mode=config["mode"])
    except (KeyError, TypeError, ValueError, UsageError):
        out.skip("step record without a usable model_spec / workload")
        return
    metrics = [r.get("metrics") if isinstance(r.get("metrics"), dict) else {} for r in records]
    phases = {}
    for phase in workload.phases:
        values = [v for v in (m.get(f"{phase}_ms_median") for m in metrics) if _positive(v)]
        if not values:
            out.skip(f"step record without a positive {phase}_ms_median")
            return
        phases[phase] = median(values) / 1e3
    gemm = [g for g in (m.get("gemm_TFLOPps") for m in metrics) if _positive(g)]
    threads = env.get("threads") or metrics[0].get("threads")
    out.steps.append(StepPoint(model=model, workload=workload, attention=str(config.get("attention", "sdpa")),
                               phases=phases, gemm_flops_per_s=median(gemm) * 1e12 if gemm else None,
                               host=str(env.get("device_name") or env.get("cpu_model") or "unknown"),
                               threads=threads if isinstance(threads, int) and not isinstance(threads, bool)
                               else None, records=len(records)))


def _whole(value: Any) -> int:
    """A count as the record stores it: an integer (2.5 sequences or "4" is not one)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"not a whole number: {value!r}")
    return value


def _positive(value: Any) -> bool:
    """A usable measurement: a finite number above zero."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _attention(record: dict[str, Any], out: RecordSet) -> None:
    config, metrics = record.get("config") or {}, record.get("metrics") or {}
    heads = config.get("heads", config.get("n_heads"))
    head_dim = config.get("dim", config.get("head_dim"))
    forward = metrics.get("fwd_ms_median", metrics.get("forward_ms_median"))
    backward = metrics.get("bwd_ms_median", metrics.get("backward_ms_median"))
    needed = (config.get("batch"), config.get("seq"), heads, head_dim, forward)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in needed):
        out.skip("attention record without batch/seq/heads/dim/forward time")
        return
    out.attention.append(AttentionPoint(int(config["batch"]), int(config["seq"]), int(heads), int(head_dim),
                                        str(config.get("dtype", config.get("precision", "fp32"))),
                                        str(config.get("impl", config.get("backend", "sdpa"))),
                                        bool(config.get("causal", True)), forward / 1e3,
                                        backward / 1e3 if isinstance(backward, (int, float)) else None))


def _comm(record: dict[str, Any], out: RecordSet) -> None:
    config, metrics = record.get("config") or {}, record.get("metrics") or {}
    if config.get("record") == "point":
        out.skip("comm measurement point (only α–β fits are used)")
        return
    world = config.get("world_size", config.get("world", config.get("ranks")))
    alpha, beta = metrics.get("alpha_us"), metrics.get("beta_GBps")
    if not isinstance(world, int) or not isinstance(alpha, (int, float)) or not isinstance(beta, (int, float)):
        out.skip("comm record without world_size / alpha_us / beta_GBps")
        return
    out.comm.append(CommPoint(str(config.get("op", "all_reduce")), world, str(config.get("backend", "?")),
                              float(alpha), float(beta), float(metrics.get("bus_factor") or 1.0)))
