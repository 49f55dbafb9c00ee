"""What the report says about each record kind: a one-line description and which metric its plot shows.

A kind not listed still gets a section, a table and a plot: its first median (or first numeric metric) per row
(`plots.choose_plot`). The descriptions repeat the README's in a sentence so a reader of the page alone knows
what was measured."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlotHint:
    """How one table of a kind is plotted."""

    y: tuple[str, ...]
    """Metrics to plot, the first one the records have wins."""
    x: str | None = None
    """A numeric config field for a line chart (None: one bar per row)."""
    log: bool = False
    """Both axes logarithmic (sizes and times over decades)."""
    label: tuple[str, ...] = ()
    """Fields naming a bar (default: the configuration fields that differ between rows)."""
    series: tuple[str, ...] = ()
    """Fields naming a line of a line chart (default: the configuration fields that differ between rows and do
    not follow x)."""


DESCRIPTIONS = {
    "step": "One training step timed phase by phase (forward, backward, optimizer) after untimed warm-up steps.",
    "step-ab": "Two setups timed alternately, whole step against whole step; the ratio of their times.",
    "profile": "Where a step's time goes by kernel category, from the PyTorch profiler.",
    "profile-category": "Profiled time per phase and kernel category.",
    "profile-op": "The ops that took the most time, per phase.",
    "profile-share": "Share of each phase's time in matmuls and attention.",
    "profile-timer": "The profiled ranges against the step timer (profiler overhead and gaps between ops).",
    "profile-attention": "Time of the pieces of attention.",
    "profile-moe": "Time of the pieces of the Mixture-of-Experts blocks: router, dispatch, experts, combine, shared.",
    "memory": "Memory of a step: current and peak bytes per phase, residual and parameter memory.",
    "memory-phase": "Memory per phase of the measured step.",
    "memory-alloc": "The largest allocations live during the measured step.",
    "attention": "Attention implementations timed side by side, checked against the reference first.",
    "precision": "Numerical experiments: accumulation error and the dtypes autocast chooses.",
    "comm": "Collectives with nccl-tests' conventions (time = max over ranks, algbw, busbw) and their α–β fits.",
    "ddp": "Data-parallel variants timed side by side, gradients checked against the reference.",
    "moe-ep": "An MoE layer expert-parallel over ranks: router, all-to-all dispatch, experts, combine (slowest rank).",
    "moe-vs-dense": "An MoE step beside the dense model of equal activated FLOPs; its MoE block piece by piece.",
    "innet-bench": "In-network aggregation against the collective it replaces.",
    "innet-train": "Training through in-network aggregation, with and without faults.",
    "innet-simulate": "The in-network aggregation simulator swept over its parameters.",
    "innet-timeout-profile": "Retransmission timeouts under loss.",
    "innet-switch": "What the aggregation switch served.",
    "trace": "PyTorch profiler traces of real runs: per rank and step, idle / compute / communication time.",
    "trace-tally": "Host API calls, device kernels and memory operations of profiler traces, tallied per file.",
    "predict": "Predicted training steps (performance model): time, throughput, MFU, memory per GPU.",
    "plan": "Parallel plans searched by the performance model, best first.",
    "compare": "Measured steps (or traces) next to the performance model's prediction of the same configuration.",
    "calibrate": "A system fitted to measured steps.",
    "calibrate-published": "A system fitted to published runs, and every run of that system predicted with it.",
    "calibrate-rates": "A system's curve top, fused-attention and fp8 efficiency fitted to a GPU's measured op rates.",
    "calibrate-trace": "A system fitted to a GPU profiler trace: GEMM efficiency by shape, attention and elementwise "
                       "rates, the collectives' latency and bandwidth.",
    "op-rates": "A model's own GEMMs and attention timed on a GPU, beside the rates the performance model assumes.",
    "validate": "Published measured runs next to the performance model's prediction.",
}

HINTS: dict[tuple[str, str | None], PlotHint] = {
    ("step", None): PlotHint(("step_ms_median",)),
    ("step-ab", None): PlotHint(("ratio_median", "step_ms_median")),
    ("profile", None): PlotHint(("step_timer_ms",)),
    ("profile-category", None): PlotHint(("time_ms",), label=("phase", "category")),
    ("profile-op", None): PlotHint(("time_ms",), label=("phase", "op")),
    ("profile-share", None): PlotHint(("matmul_pct",), label=("phase",)),
    ("profile-timer", None): PlotHint(("timer_ms",), label=("phase",)),
    ("memory", None): PlotHint(("peak_MiB",)),
    ("memory-phase", None): PlotHint(("peak_MiB",), label=("phase",)),
    ("memory-alloc", None): PlotHint(("size_MiB",), label=("op",)),
    ("comm", "point"): PlotHint(("time_us_max", "time_us_mean"), x="size_bytes", log=True,
                                series=("backend", "op", "world_size", "dtype", "mode", "in_place", "redop", "skew",
                                        "source")),
    ("comm", "fit"): PlotHint(("beta_GBps",)),
    ("trace", "rank"): PlotHint(("step_ms",), label=("rank",)),
    ("trace", "step"): PlotHint(("step_ms",), label=("rank", "step")),
    ("trace", "category"): PlotHint(("time_ms",), label=("rank", "step", "category")),
    ("trace", "collective"): PlotHint(("time_ms",), label=("rank", "step", "collective")),
    ("trace", "kernel"): PlotHint(("total_ms",), label=("rank", "kernel")),
    ("trace", "cpu_op"): PlotHint(("total_ms",), label=("rank", "cpu_op")),
    ("trace", "straggler"): PlotHint(("spread_ms",), label=("step",)),
    ("predict", None): PlotHint(("step_s",)),
    ("plan", None): PlotHint(("step_s", "tokens_per_s")),
    ("compare", None): PlotHint(("step_error_pct",)),
    ("validate", None): PlotHint(("error_pct",), label=("run",)),
    ("moe-ep", None): PlotHint(("layer_ms_median",)),
}


def hint(kind: str, table: str | None) -> PlotHint | None:
    """The plot hint of one table of a kind (None: the generic choice)."""
    return HINTS.get((kind, table))
