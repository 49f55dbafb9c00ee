"""`stepscope step`: time a training step per phase and derive tokens/s, FLOP/s, MFU, GEMM fraction.

Derived metrics (formulas visible on purpose):
- forward FLOPs = tokens x spec.forward_flops_per_token(seq, causal=True); backward = 2 x forward;
  the step counts forward (+ backward); the optimizer's elementwise work is not counted;
- achieved FLOP/s = FLOPs / median time; tokens/s = batch·seq / median step time;
- MFU = achieved / published peak (GPUs with a known peak); on CPUs the GEMM fraction =
  achieved / the measured rate of a large matmul in the same dtype and thread count (gemm.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stepscope.measure.device import (
    cpu_threads,
    is_out_of_memory,
    release_memory,
    resolve_device,
    synchronize,
)
from stepscope.measure.environment import torch_environment
from stepscope.measure.gemm import gemm_rate
from stepscope.measure.peaks import peak_flops
from stepscope.measure.stats import Stats
from stepscope.measure.step.config import StepConfig
from stepscope.measure.timer import PhaseClock
from stepscope.measure.training import TrainingStep, transformer_step
from stepscope.results.sweep import Sweep, SweepOutcome

PHASE_COLUMNS = ("phase", "median_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "p10_ms", "p90_ms", "tokens_per_s",
                 "TFLOPps", "mfu_pct", "gemm_fraction")
"""Columns of `StepResult.rows()`: mfu_pct only with a known GPU peak, gemm_fraction only on CPUs."""


@dataclass
class StepResult:
    """Timings (seconds) per phase plus what is needed to derive rates."""

    config: StepConfig
    phases: dict[str, Stats]
    """forward, backward, optimizer (as the mode has them) and step (their sum per iteration)."""
    threads: int
    device: str
    compile_s: float | None = None
    gemm_flops_per_s: float | None = None
    peak_flops_per_s: float | None = None

    def phase_flops(self) -> dict[str, float]:
        spec, workload = self.config.model, self.config.workload
        forward = workload.tokens * spec.forward_flops_per_token(workload.seq, causal=True)
        flops = {"forward": forward, "backward": 2.0 * forward, "optimizer": 0.0}
        flops["step"] = forward * (1.0 if workload.mode == "fwd" else 3.0)
        return {phase: flops[phase] for phase in self.phases}

    def rows(self) -> list[dict[str, Any]]:
        """One row per phase: time statistics (ms), tokens/s, TFLOP/s, MFU or fraction of GEMM rate."""
        rows = []
        tokens = self.config.workload.tokens
        for phase, flops in self.phase_flops().items():
            stats = self.phases[phase].scaled(1e3)
            achieved = flops / self.phases[phase].median if flops else None
            row: dict[str, Any] = {"phase": phase, "median_ms": stats.median, "mean_ms": stats.mean,
                                   "std_ms": stats.std, "min_ms": stats.min, "max_ms": stats.max,
                                   "p10_ms": stats.p10, "p90_ms": stats.p90,
                                   "tokens_per_s": tokens / self.phases[phase].median if phase == "step" else None,
                                   "TFLOPps": achieved / 1e12 if achieved else None}
            if self.peak_flops_per_s:
                row["mfu_pct"] = 100.0 * achieved / self.peak_flops_per_s if achieved else None
            if self.gemm_flops_per_s:
                row["gemm_fraction"] = achieved / self.gemm_flops_per_s if achieved else None
            rows.append(row)
        return rows

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for phase, stats in self.phases.items():
            metrics.update(stats.metrics(phase))
        for row in self.rows():
            phase = row["phase"]
            if row["TFLOPps"] is not None:
                metrics[f"{phase}_TFLOPps"] = row["TFLOPps"]
            if row.get("mfu_pct") is not None:
                metrics[f"{phase}_mfu_pct"] = row["mfu_pct"]
            if row.get("gemm_fraction") is not None:
                metrics[f"{phase}_gemm_fraction"] = row["gemm_fraction"]
        metrics["step_tokens_per_s"] = self.config.workload.tokens / self.phases["step"].median
        metrics["step_flops"] = self.phase_flops()["step"]
        metrics["params"] = self.config.model.param_count()
        metrics["threads"] = self.threads
        if self.compile_s is not None:
            metrics["compile_s"] = self.compile_s
        if self.gemm_flops_per_s:
            metrics["gemm_TFLOPps"] = self.gemm_flops_per_s / 1e12
        if self.peak_flops_per_s:
            metrics["peak_TFLOPps"] = self.peak_flops_per_s / 1e12
        return metrics


def time_phases(step: TrainingStep, iters: int, device: torch.device) -> dict[str, Stats]:
    """Wall time per phase (and their sum, `step`) over `iters` steps, a device sync at every lap."""
    synchronize(device)
    clock = PhaseClock(device)
    samples: dict[str, list[float]] = {phase: [] for phase in (*step.workload.phases, "step")}
    for _ in range(iters):
        step.prepare()
        clock.start()
        step.run(clock.lap)
        for phase, seconds in clock.laps.items():
            samples[phase].append(seconds)
        samples["step"].append(sum(clock.laps.values()))
    return {phase: Stats.of(values) for phase, values in samples.items()}


def benchmark_step(config: StepConfig) -> StepResult:
    """Build the model, warm up, then time `iters` steps phase by phase."""
    device = resolve_device(config.device)
    with cpu_threads(config.threads) as threads:
        step = transformer_step(config.model, config.workload, attention=config.attention, device=device,
                            compile=config.compile, seed=config.seed, moe_impl=config.moe_impl)
        compile_s = step.compile_seconds() if config.compile else None
        for _ in range(config.warmup):
            step.prepare()
            step.run()
        phases = time_phases(step, config.iters, device)
        del step
        gemm = gemm_rate(config.workload.precision, device) if device.type == "cpu" else None
    return StepResult(config=config, phases=phases, threads=threads,
                      device=device.type, compile_s=compile_s, gemm_flops_per_s=gemm,
                      peak_flops_per_s=peak_flops(device, config.workload.precision))


def run_step_sweep(configs: list[StepConfig], out: str | os.PathLike | None = None, *, resume: bool = False,
                   on_record: Callable[[dict[str, Any], StepConfig, StepResult | None], None]
                   = lambda record, config, result: None) -> SweepOutcome:
    """Benchmark every config (validated first) into `<out>/step.jsonl` (None: records are only returned);
    OOM points become `oom` rows."""
    for config in configs:
        config.validate()
    device = resolve_device(configs[0].device)

    def measure(config: StepConfig) -> tuple[dict[str, Any], StepResult]:
        result = benchmark_step(config)
        return result.metrics(), result

    def env(config: StepConfig) -> dict[str, Any]:
        return torch_environment(device, threads=config.threads)

    sweep = Sweep(kind="step", points=configs, config_of=StepConfig.record_config, measure=measure, env_of=env,
                  is_oom=is_out_of_memory, after_oom=lambda: release_memory(device))
    return sweep.run(out, resume=resume, on_record=on_record)
