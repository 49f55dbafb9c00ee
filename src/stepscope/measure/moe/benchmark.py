"""`stepscope step --vs-dense`: an MoE model's training step beside the dense model of equal activated FLOPs,
and its MoE block piece by piece, in one run.

Candidates, all in one `timer.interleaved_rounds` (every candidate once per round, the order rotating):
- `moe step`, `dense step`: whole training steps of the MoE model and of `config.dense_equivalent` (same
  seed, width, depth, attention; its MLPs (k + shared) x expert_d_ff wide), lapped per phase as `step` does;
- `moe block`, `reference block`, `dense mlp`: one MoE block (grouped fast path), its reference twin (the loop
  over experts) and the dense MLP of equal activated FLOPs, on the step's batch x seq tokens;
- the block's pieces (`pieces`): router, permute, experts, combine (and shared).
Before timing, the grouped block is checked against the reference: output and every gradient, within
`TOLERANCE` of the precision (a mismatch keeps the record, status `mismatch`, and the run exits 1).

Reported: per candidate the median of each phase over the rounds; the median of the per-round ratios MoE / dense
(each step phase and the whole step) and grouped / reference (block forward); each piece's median as a share of
the block's median. On a CPU the 1-minute load average before and after the run is recorded too: the timing of
two threads on a shared machine stalls whenever another process holds a core, small GEMMs most.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Any

from stepscope.measure.device import autocast, cpu_threads, is_out_of_memory, release_memory, resolve_device
from stepscope.measure.environment import torch_environment
from stepscope.measure.moe.config import PIECES, TOLERANCE, MoEDenseConfig
from stepscope.measure.moe.pieces import block_error, build_block_bench
from stepscope.measure.stats import Stats
from stepscope.measure.timer import PhaseClock, interleaved_rounds
from stepscope.measure.training import transformer_step
from stepscope.results.store import RecordStore, make_record
from stepscope.results.tables import Table

STEPS = ("moe step", "dense step")
BLOCKS = ("moe block", "reference block", "dense mlp")


@dataclass
class MoEDenseResult:
    """Every candidate's per-round phase times (seconds), the check, and the conditions of the run."""

    config: MoEDenseConfig
    samples: dict[str, list[dict[str, float]]]
    """Per candidate, per timed round: phase -> seconds."""
    max_error: float
    """Largest |grouped - reference| / max |reference| of the block's output and gradients."""
    gemm_kind: str
    threads: int
    device: str
    load_average: tuple[float, float] | None
    """1-minute load average before and after the timed rounds (None where the OS has none)."""

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.config.step.workload.precision]

    @property
    def matches(self) -> bool:
        return self.max_error <= self.tolerance

    def seconds(self, label: str, phase: str | None = None) -> list[float]:
        """Per round: one phase of a candidate, or all its phases summed (None)."""
        return [laps[phase] if phase else sum(laps.values()) for laps in self.samples[label]]

    def ratio(self, a: str, b: str, phase: str | None = None) -> Stats:
        """Per-round ratio time(a) / time(b) (one phase, or the whole candidate)."""
        return Stats.of([x / y for x, y in zip(self.seconds(a, phase), self.seconds(b, phase), strict=True)])

    def step_rows(self) -> list[dict[str, Any]]:
        """Per phase and for the whole step: both medians and the median of the per-round ratios."""
        rows = []
        for phase in (*self.config.step.workload.phases, None):
            rows.append({"phase": phase or "step",
                         "moe_ms": 1e3 * statistics.median(self.seconds(STEPS[0], phase)),
                         "dense_ms": 1e3 * statistics.median(self.seconds(STEPS[1], phase)),
                         "moe_over_dense": self.ratio(*STEPS, phase).median})
        return rows

    def rates(self) -> dict[str, dict[str, float]]:
        """Per model: tokens/s and activated TFLOP/s of its median step (FLOPs as `step` counts them)."""
        workload = self.config.step.workload
        out = {}
        for label, spec in zip(STEPS, (self.config.step.model, self.config.dense), strict=True):
            step = statistics.median(self.seconds(label))
            flops = workload.tokens * spec.forward_flops_per_token(workload.seq) * (1 if workload.mode == "fwd" else 3)
            out[label] = {"tokens_per_s": workload.tokens / step, "activated_TFLOPps": flops / step / 1e12}
        return out

    def block_rows(self) -> list[dict[str, Any]]:
        block = statistics.median(self.seconds("moe block"))
        dense = statistics.median(self.seconds("dense mlp"))
        backward = self.config.step.workload.mode != "fwd"
        rows = []
        for label in (*BLOCKS, *(p for p in PIECES if p in self.samples)):
            total = statistics.median(self.seconds(label))
            rows.append({"candidate": label,
                         "forward_ms": 1e3 * statistics.median(self.seconds(label, "forward")),
                         "backward_ms": 1e3 * statistics.median(self.seconds(label, "backward")) if backward else None,
                         "total_ms": 1e3 * total,
                         "pct_of_moe_block": 100.0 * total / block if label in PIECES or label == "moe block" else None,
                         "vs_dense_mlp": total / dense})
        return rows

    def tables(self) -> list[Table]:
        c = self.config.step
        where = f"{self.device}, {self.threads} threads" + (
            f", load average {self.load_average[0]:.2f} -> {self.load_average[1]:.2f}" if self.load_average else "")
        steps = Table("moe-vs-dense", f"{c.model.name} step (experts of d_ff {c.model.expert_d_ff}) against its dense "
                      f"equivalent (d_ff {self.config.dense.d_ff}), batch {c.workload.batch} seq {c.workload.seq} "
                      f"{c.workload.mode} {c.workload.precision}; medians of {c.iters} interleaved rounds, "
                      f"moe_over_dense: median of the per-round ratios ({where})", ("phase",), self.step_rows())
        block = Table("moe-vs-dense", f"one MoE block ({c.workload.tokens} tokens; experts as {self.gemm_kind}) "
                      "beside its reference and the dense MLP; its pieces as shares of the block", ("candidate",),
                      self.block_rows())
        return [steps, block]

    def rates_line(self) -> str:
        """tokens/s and activated TFLOP/s of both steps."""
        return "; ".join(f"{label}: {rate['tokens_per_s']:,.0f} tokens/s, {rate['activated_TFLOPps']:.3g} activated "
                         "TFLOP/s" for label, rate in self.rates().items())

    def verdict(self) -> str:
        flops = self.config.flops_ratio
        forward = self.ratio("moe block", "reference block", "forward").median
        return (f"MoE step / dense step: {self.ratio(*STEPS).median:.3f} (activated FLOPs {flops:.3f}x); grouped "
                f"block forward / reference forward: {forward:.3f}; grouped block equals the reference: max error "
                f"{self.max_error:.2e} of max |value| (tolerance {self.tolerance:g})"
                + ("" if self.matches else " -- MISMATCH, timings not valid"))

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for label, samples in self.samples.items():
            prefix = label.replace(" ", "_")
            for phase in samples[0]:
                metrics.update(Stats.of(self.seconds(label, phase)).metrics(f"{prefix}_{phase}"))
            metrics.update(Stats.of(self.seconds(label)).metrics(prefix))
        for phase in (*self.config.step.workload.phases, None):
            ratio = self.ratio(*STEPS, phase)
            name = f"step_{phase}_ratio" if phase else "step_ratio"
            metrics.update({f"{name}_median": ratio.median, f"{name}_p10": ratio.p10, f"{name}_p90": ratio.p90})
        for label, rate in self.rates().items():
            prefix = label.replace(" ", "_")
            metrics.update({f"{prefix}_tokens_per_s": rate["tokens_per_s"],
                            f"{prefix}_activated_TFLOPps": rate["activated_TFLOPps"]})
        metrics["block_forward_vs_reference_median"] = self.ratio("moe block", "reference block", "forward").median
        metrics["block_vs_dense_mlp_median"] = self.ratio("moe block", "dense mlp").median
        block = statistics.median(self.seconds("moe block"))
        for piece in PIECES:
            if piece in self.samples:
                metrics[f"{piece}_pct_of_block"] = 100.0 * statistics.median(self.seconds(piece)) / block
        metrics.update({"max_abs_error": self.max_error, "flops_ratio": self.config.flops_ratio,
                        "gemm_kind": self.gemm_kind, "threads": self.threads})
        if self.load_average:
            metrics.update({"load_average_start": self.load_average[0], "load_average_end": self.load_average[1]})
        return metrics


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def benchmark_moe_vs_dense(config: MoEDenseConfig) -> MoEDenseResult:
    """Build both steps and the block's candidates, check the block, then time every candidate once per round."""
    step = config.step
    device = resolve_device(step.device)
    workload = step.workload
    with cpu_threads(step.threads) as threads:
        steps = {"moe step": transformer_step(step.model, workload, attention=step.attention, device=device,
                                              compile=step.compile, seed=step.seed, moe_impl=step.moe_impl),
                 "dense step": transformer_step(config.dense, workload, attention=step.attention, device=device,
                                                compile=step.compile, seed=step.seed)}
        if step.compile:  # the first call compiles: never inside a timed round
            for training_step in steps.values():
                training_step.compile_seconds()
        bench = build_block_bench(step.model, config.dense, workload.tokens, device, workload.precision,
                                  backward=workload.mode != "fwd", seed=step.seed, compile=step.compile)
        error = block_error(bench, device, workload.precision)
        clock = PhaseClock(device)

        def one(label: str, _: int) -> dict[str, float]:
            if label in steps:
                steps[label].prepare()
                clock.start()
                steps[label].run(clock.lap)
            else:
                candidate = bench.candidates[label]
                candidate.prepare()
                clock.start()
                candidate.run(clock.lap, lambda: autocast(device, workload.precision))
            return dict(clock.laps)

        before = _load_average()
        samples = interleaved_rounds([*steps, *bench.candidates], one, warmup=step.warmup, iters=step.iters)
        after = _load_average()
        gemm_kind = bench.gemm_kind
    load = (before, after) if before is not None and after is not None and device.type == "cpu" else None
    return MoEDenseResult(config=config, samples=samples, max_error=error, gemm_kind=gemm_kind,
                          threads=threads, device=device.type, load_average=load)


def run_moe_vs_dense(config: MoEDenseConfig, out: str | os.PathLike | None = None
                     ) -> tuple[dict[str, Any], MoEDenseResult | None]:
    """Benchmark the point and append its `moe-vs-dense` record to `<out>/moe-vs-dense.jsonl` (None: not stored);
    an out-of-memory error is an `oom` record (result None), a block that differs from its reference a
    `mismatch` one."""
    config.validate()
    store = RecordStore(out, "moe-vs-dense").check_writable() if out is not None else None
    device = resolve_device(config.step.device)
    env = torch_environment(device, threads=config.step.threads)
    result = None
    try:
        result = benchmark_moe_vs_dense(config)
        record = make_record("moe-vs-dense", config.record_config(), result.metrics(), env=env,
                             status="ok" if result.matches else "mismatch",
                             note=None if result.matches else result.verdict())
    except Exception as error:  # noqa: BLE001 - an out-of-memory is a result (a row), anything else a bug
        if not is_out_of_memory(error):
            raise
        release_memory(device)
        record = make_record("moe-vs-dense", config.record_config(), status="oom", env=env,
                             note=str(error).splitlines()[0])
    if store is not None:
        store.append(record)
    return record, result
