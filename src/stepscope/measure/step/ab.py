"""`stepscope step --ab`: two step configurations timed side by side.

Two separate runs of `stepscope step` compare two moments as much as two setups: on a shared machine the
load, the clock and the caches drift between them. The A/B mode builds both setups in one process and
times whole steps alternately with the harness's interleaved mode (`timer.interleaved`: A B, B A, A B, ...),
so drift hits both alike; the answer is the median of the per-pair ratios time(A) / time(B), with its
spread. Each timed call is one whole step (the untimed `prepare` of a fwd-bwd step, dropping gradients,
is inside it: microseconds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.measure.device import (
    cpu_threads,
    is_out_of_memory,
    release_memory,
    resolve_device,
)
from stepscope.measure.environment import torch_environment
from stepscope.measure.stats import Stats
from stepscope.measure.step.config import StepConfig
from stepscope.measure.timer import ABResult, interleaved
from stepscope.measure.training import TrainingStep, transformer_step
from stepscope.results.store import RecordStore, make_record

SHARED_FIELDS = ("device", "warmup", "iters", "threads", "compile")
"""What A and B must share: the comparison is between setups, under one measurement."""


def check_pair(configs: list[StepConfig]) -> tuple[StepConfig, StepConfig]:
    """The two configurations of an A/B run (raises UsageError unless there are exactly two comparable ones)."""
    if len(configs) != 2:
        raise UsageError(f"--ab compares exactly two setups (two values of one option, e.g. --attention naive,sdpa); "
                         f"these options make {len(configs)}")
    a, b = configs
    for name in SHARED_FIELDS:
        if getattr(a, name) != getattr(b, name):
            raise UsageError(f"--ab runs both setups under one measurement: give one value of --{name}")
    return a, b


def describe(config: StepConfig, other: StepConfig) -> str:
    """What sets `config` apart from `other` (its values of the fields that differ)."""
    mine, theirs = config.record_config(), other.record_config()
    spec, other_spec = mine.pop("model_spec"), theirs.pop("model_spec")
    parts = [f"{key} {value}" for key, value in mine.items() if theirs.get(key) != value]
    parts += [f"{key} {value}" for key, value in spec.items()
              if other_spec.get(key) != value and key != "name" and mine["model"] == theirs["model"]]
    return ", ".join(parts) or "identical setup"


@dataclass
class StepABResult:
    """A and B's step times (seconds) and the per-pair ratios time(A) / time(B)."""

    a: StepConfig
    b: StepConfig
    timing: ABResult
    threads: int
    device: str

    @property
    def ratio(self) -> Stats:
        return Stats.of(self.timing.ratios)

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, config, other, stats in (("A", self.a, self.b, self.timing.a), ("B", self.b, self.a, self.timing.b)):
            ms = stats.scaled(1e3)
            rows.append({"variant": name, "setup": describe(config, other), "step_ms_median": ms.median,
                         "step_ms_p10": ms.p10, "step_ms_p90": ms.p90, "step_ms_std": ms.std,
                         "tokens_per_s": config.workload.tokens / stats.median})
        return rows

    def verdict(self) -> str:
        ratio = self.ratio
        faster, factor = ("B", ratio.median) if ratio.median >= 1 else ("A", 1 / ratio.median)
        return (f"time(A) / time(B): median {ratio.median:.3f} (p10 {ratio.p10:.3f}, p90 {ratio.p90:.3f}) over "
                f"{ratio.n} interleaved pairs: {faster} is {factor:.2f}x faster")

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {**self.timing.a.metrics("a_step"), **self.timing.b.metrics("b_step")}
        metrics.update({"ratio_median": self.ratio.median, "ratio_p10": self.ratio.p10,
                        "ratio_p90": self.ratio.p90, "pairs": self.ratio.n, "threads": self.threads})
        return metrics

    def record_config(self) -> dict[str, Any]:
        return {"a": self.a.record_config(), "b": self.b.record_config()}


def benchmark_ab(a: StepConfig, b: StepConfig) -> StepABResult:
    """Build both setups, warm each up, then time whole steps A and B alternately (`a.iters` pairs)."""
    device = resolve_device(a.device)
    with cpu_threads(a.threads) as threads:
        steps = [transformer_step(c.model, c.workload, attention=c.attention, device=device, compile=c.compile,
                              seed=c.seed, moe_impl=c.moe_impl) for c in (a, b)]
        if a.compile:  # the first call compiles: never inside a timed pair, whatever --warmup says
            for step in steps:
                step.compile_seconds()

        def step_of(step: TrainingStep):
            def one() -> None:
                step.prepare()
                step.run()
            return one

        timing = interleaved(step_of(steps[0]), step_of(steps[1]), warmup=a.warmup, iters=a.iters, device=device)
        del steps
    return StepABResult(a=a, b=b, timing=timing, threads=threads, device=device.type)


@dataclass
class StepABOutcome:
    """The `step-ab` record of one A/B run, and its result (None when a setup ran out of memory)."""

    record: dict[str, Any]
    result: StepABResult | None


def run_step_ab(configs: list[StepConfig], out: str | os.PathLike | None = None) -> StepABOutcome:
    """Check the pair, time it (`benchmark_ab`) and append one `step-ab` record to `<out>/step-ab.jsonl`
    (None: not stored); an out-of-memory error is an `oom` record, anything else propagates."""
    a, b = check_pair(configs)
    for config in (a, b):
        config.validate()
    store = RecordStore(out, "step-ab").check_writable() if out is not None else None
    device = resolve_device(a.device)
    env = torch_environment(device, threads=a.threads)
    result = None
    try:
        result = benchmark_ab(a, b)
        record = make_record("step-ab", result.record_config(), result.metrics(), env=env)
    except Exception as error:  # noqa: BLE001 - an out-of-memory is a result (a row), anything else a bug
        if not is_out_of_memory(error):
            raise
        release_memory(device)
        record = make_record("step-ab", {"a": a.record_config(), "b": b.record_config()}, status="oom", env=env,
                             note=str(error).splitlines()[0])
    if store is not None:
        store.append(record)
    return StepABOutcome(record, result)
