"""The attention benchmark: every implementation on the same problems, checked, then timed side by side.

Per point (batch, heads, seq, dim, dtype, causal) and implementation, in this order:
1. correctness (measure/attention_check.py): one forward (+ backward) against the fp64 reference; an
   error above the dtype's tolerance makes a `mismatch` row and the implementation is not timed;
2. memory: one run under the allocation tracker of `attention_memory` (peaks, saved bytes);
3. time: `warmup` untimed rounds, then `iters` rounds in which every implementation runs once, the
   order rotating each round (A B C, B C A, C A B, ...) so that load drift hits all alike. Per pass:
   time statistics, TFLOP/s by the FlashAttention convention, and the median per-round ratio to
   sdpa and to naive: the side-by-side figures the performance claims rest on.
An out-of-memory error at any step gives that implementation an `oom` row, any other exception an
`error` row with its message; the other implementations go on. Ctrl-C stops the sweep (finished points
are on disk).

Records (kind `attention`) are one per point and implementation. Because the implementations of a
point are measured together, this runs its own loop per point instead of `results.sweep.Sweep`
(which measures one record at a time), with the same resume, OOM and Ctrl-C behaviour.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stepscope.measure.attention.check import AttentionProblem, check_correctness
from stepscope.measure.attention.config import OWN_IMPLS, AttentionBenchConfig, AttentionPoint
from stepscope.measure.attention.memory import measure_attention_memory
from stepscope.measure.device import (
    DTYPES,
    cpu_threads,
    is_out_of_memory,
    release_memory,
)
from stepscope.measure.environment import torch_environment
from stepscope.measure.stats import Stats
from stepscope.measure.timer import PhaseClock, interleaved_rounds
from stepscope.nn.attention import (
    AttentionFn,
    get_attention,
    unsupported_reason,
)
from stepscope.nn.attention_reference import attention_flops
from stepscope.results.files import check_plot_file
from stepscope.results.store import RecordStore, make_record, point_key
from stepscope.results.sweep import SweepOutcome

BASELINES = ("sdpa", "naive")
"""Every implementation's time is also reported as a ratio to these (when they ran)."""
_PREFIX = {"fwd": "fwd", "bwd": "bwd", "fwd-bwd": "fwd_bwd"}


@dataclass
class ImplResult:
    """What happened to one implementation at one point."""

    status: str = "ok"
    metrics: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def attention_impl(name: str) -> AttentionFn:
    """A fresh callable of implementation `name`. For `compiled`, dynamo's caches are reset first: one
    compilation per shape, so a long sweep never reaches dynamo's recompile limit."""
    if name == "compiled":
        import torch._dynamo

        torch._dynamo.reset()
    return get_attention(name)


def _time_rounds(problem: AttentionProblem, fns: dict[str, Callable], config: AttentionBenchConfig,
                 device: torch.device, results: dict[str, ImplResult]) -> dict[str, list[dict[str, float]]]:
    """Seconds per phase (`fwd`, `bwd`) of every timed round, per implementation, through the interleaved
    harness; an implementation that raises gets its row and leaves the later rounds."""
    grad_out = problem.grad_out if config.needs_backward else None
    clock = PhaseClock(device)

    def one_round(name: str, _: int) -> dict[str, float] | None:
        try:
            clock.start()
            problem.run(fns[name], grad_out, clock.lap)
        except Exception as error:  # noqa: BLE001 - a failing implementation becomes a row
            _fail(error, results[name], device)
            return None
        return dict(clock.laps)

    return interleaved_rounds(list(fns), one_round, warmup=config.warmup, iters=config.iters)


def _fail(error: Exception, result: ImplResult, device: torch.device) -> None:
    """An implementation that raised: `oom` row for out-of-memory, `error` row (with the message) otherwise."""
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    if is_out_of_memory(error):
        release_memory(device)
        result.status, result.note = "oom", first_line
    else:
        result.status, result.note = "error", f"{type(error).__name__}: {first_line}"
    result.metrics = {}


def _timing_metrics(point: AttentionPoint, config: AttentionBenchConfig, samples: dict[str, list[dict[str, float]]],
                    results: dict[str, ImplResult]) -> None:
    """Time statistics, TFLOP/s and ratios to the baselines, per requested pass, into each ok result."""
    per_pass: dict[str, dict[str, np.ndarray]] = {}
    for name, rounds in samples.items():
        if results[name].status != "ok":
            continue
        fwd = np.asarray([laps["fwd"] for laps in rounds])
        bwd = np.asarray([laps["bwd"] for laps in rounds if "bwd" in laps])
        per_pass[name] = {"fwd": fwd, "bwd": bwd, "fwd-bwd": fwd + bwd if len(bwd) else bwd}
    for name, times in per_pass.items():
        metrics = results[name].metrics
        for pass_ in config.passes:
            prefix = _PREFIX[pass_]
            stats = Stats.of(times[pass_].tolist())
            metrics.update(stats.metrics(prefix))
            flops = attention_flops(point.batch_heads, point.seq, point.seq, point.dim, point.causal, pass_)
            metrics[f"{prefix}_TFLOPps"] = flops / stats.median / 1e12
            for base in BASELINES:
                if base != name and base in per_pass:
                    metrics[f"{prefix}_ratio_vs_{base}"] = float(np.median(times[pass_] / per_pass[base][pass_]))
    naive = results.get("naive")
    for name, result in results.items():
        if result.status == "ok" and name != "naive" and naive is not None and naive.status == "ok":
            for key in ("fwd_peak_MiB", "bwd_peak_MiB"):
                if key in result.metrics and naive.metrics.get(key):
                    result.metrics[key.replace("_MiB", "_ratio_vs_naive")] = result.metrics[key] / naive.metrics[key]


def _check_and_measure_memory(name: str, fn: Callable, problem: AttentionProblem, config: AttentionBenchConfig,
                              device: torch.device) -> ImplResult:
    """Steps 1 and 2 for one implementation: the correctness gate, then the memory run."""
    point = problem.point
    result = ImplResult()
    started = time.perf_counter()
    errors = check_correctness(problem, fn)
    if name == "compiled":
        result.metrics["first_call_s"] = time.perf_counter() - started
    tolerances = problem.tolerances(name)
    result.metrics.update(errors, tolerance=max(tolerances.values()),
                          checked_rows=point.seq if problem.rows is None else int(problem.rows.numel()))
    failed = {key: value for key, value in errors.items() if not (np.isfinite(value) and value <= tolerances[key])}
    if failed:
        worst = max(failed, key=lambda key: failed[key] / tolerances[key] if np.isfinite(failed[key]) else np.inf)
        rule = "2x PyTorch's own error" if name in OWN_IMPLS and point.dtype != "fp32" else point.dtype
        result.status = "mismatch"
        result.note = f"{worst} = {errors[worst]:.3g} > tolerance {tolerances[worst]:.3g} ({rule})"
        return result
    backward = (lambda out: out.backward(problem.grad_out)) if config.needs_backward else None
    memory = measure_attention_memory(lambda: problem.run(fn, None), backward, (problem.q, problem.k, problem.v),
                                      device)
    problem.clear_grads()
    result.metrics.update(memory.metrics())
    return result


def measure_point(point: AttentionPoint, impls: tuple[str, ...], config: AttentionBenchConfig,
                  device: torch.device) -> dict[str, ImplResult]:
    """Check, measure memory and time every implementation at one point."""
    results = {name: ImplResult() for name in impls}
    try:
        problem = AttentionProblem(point, device, seed=config.seed, check_rows=config.check_rows,
                                   backward=config.needs_backward)
        problem.reference()  # now, so that no implementation's first call pays for it
    except Exception as error:  # noqa: BLE001 - no problem, no point: every implementation gets the row
        for result in results.values():
            _fail(error, result, device)
        return results
    fns: dict[str, Callable] = {}
    for name in impls:
        reason = unsupported_reason(name, device, DTYPES[point.dtype], point.dim)
        if reason:
            results[name] = ImplResult("unsupported", note=reason)
            continue
        fn = attention_impl(name)
        try:
            results[name] = _check_and_measure_memory(name, fn, problem, config, device)
        except Exception as error:  # noqa: BLE001 - a failing implementation becomes a row
            _fail(error, results[name], device)
        if results[name].status == "ok":
            fns[name] = fn
    samples = _time_rounds(problem, fns, config, device, results)
    _timing_metrics(point, config, samples, results)
    return results


def warm_up(impls: tuple[str, ...], device: torch.device, seconds: float = 1.0) -> None:
    """Run every implementation on a tiny problem for about `seconds`, and one profiler session.

    The first seconds of a process are slow (libraries page in, thread pools and kernel caches fill,
    the profiler initializes): without this the first point of a sweep measures the start-up. An
    implementation failing here is left out of the warm-up; the sweep's points report its failure.
    """
    point = AttentionPoint(batch=1, heads=1, seq=128, dim=16, dtype="fp32", causal=True)
    problem = AttentionProblem(point, device, seed=0, check_rows=point.seq, backward=True)
    fns = [attention_impl(name) for name in impls if name != "compiled"  # compiling is not warming up
           and unsupported_reason(name, device, torch.float32, point.dim) is None]
    deadline = time.perf_counter() + seconds

    def runs(fn: AttentionFn, under_tracker: bool) -> bool:
        try:
            if under_tracker:  # once, so the profiler the memory runs use is initialized too
                measure_attention_memory(lambda: problem.run(fn, None), lambda out: out.backward(problem.grad_out),
                                         (problem.q, problem.k, problem.v), device)
            problem.run(fn, problem.grad_out)
            return True
        except Exception:  # noqa: BLE001 - see docstring
            return False

    fns = [fn for index, fn in enumerate(fns) if runs(fn, index == 0)]
    while fns and time.perf_counter() < deadline:
        for fn in fns:
            problem.run(fn, problem.grad_out)
    problem.clear_grads()


def run_attention_sweep(config: AttentionBenchConfig, out: str | os.PathLike | None = None, *, resume: bool = False,
                        plot: str | os.PathLike | None = None,
                        on_point: Callable[[AttentionPoint, list[dict[str, Any]]], None] = lambda point, records: None
                        ) -> SweepOutcome:
    """Measure every point into `<out>/attention.jsonl` (None: records are only returned), point by point;
    `skipped` counts the records a resume found done. With `plot`, draw time and memory against sequence
    length from every record of the sweep's points (those a resume skipped too). Everything is validated
    and every file proven writable before any work."""
    device = config.validate()
    store = RecordStore(out, "attention").check_writable() if out is not None else None
    if plot is not None:
        check_plot_file(plot)
    outcome = SweepOutcome()
    done = store.done_keys() if (store is not None and resume) else set()
    with cpu_threads(config.threads):
        warmed = False
        for point in config.points():
            todo = tuple(impl for impl in config.impls
                         if point_key("attention", config.record_config(point, impl)) not in done)
            outcome.skipped += len(config.impls) - len(todo)
            if not todo:
                continue
            if not warmed:
                warm_up(config.impls, device, config.startup_s)
                warmed = True
            # the baselines are measured again when resuming, so the ratios stay side by side
            measured = todo + tuple(b for b in BASELINES if b in config.impls and b not in todo)
            results = measure_point(point, tuple(i for i in config.impls if i in measured), config, device)
            env = torch_environment(device)
            records = []
            for impl in todo:
                result = results[impl]
                record = make_record("attention", config.record_config(point, impl), result.metrics,
                                     status=result.status, env=env, note=result.note)
                if store is not None:
                    store.append(record)
                records.append(record)
            outcome.records.extend(records)
            on_point(point, records)
    if plot is not None:
        keys = {point_key("attention", config.record_config(point, impl))
                for point in config.points() for impl in config.impls}
        records = [r for r in store.records() if r.get("key") in keys] if store is not None else outcome.records
        if any(r["status"] == "ok" for r in records):
            from stepscope.measure.attention.plot import plot_attention

            outcome.plot = plot_attention(records, plot)
    return outcome
