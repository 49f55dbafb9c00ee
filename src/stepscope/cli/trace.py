"""`stepscope trace`: analyse PyTorch profiler (Kineto) traces of real runs, one file per rank.
The work and the records: `stepscope.traces.run.run_trace`."""

from __future__ import annotations

import argparse
import sys

from stepscope.cli.options import (
    add_config_option,
    add_output_options,
    non_negative_int,
    one_value,
    positive_float,
    positive_int,
)
from stepscope.traces.config import TraceConfig

NAME = "trace"
HELP = "analyse PyTorch profiler traces of GPU runs: per rank and step, across ranks"
DESCRIPTION = ("Read Kineto traces (.json / .json.gz, one file per rank of one job; folders are read for them) and "
               "report per rank and ProfilerStep: GPU time by category, idle / compute / non-compute time (as "
               "HolisticTraceAnalysis defines them), communication exposed and overlapped, launch overhead, top "
               "kernels and CPU ops; across ranks: step time per rank, spread, the slowest rank and the time spent "
               "waiting for it. Traces of stepscope's own `profile --trace` (CPU) are read the same way.")

PROGRESS_ABOVE_MiB = 64
"""Inputs larger than this show a progress bar on a terminal without --progress."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders of them (one file per rank)")
    group = parser.add_argument_group("analysis")
    add_config_option(group, TraceConfig, "--top", "rows of the top-kernels and top-CPU-ops tables")
    add_config_option(group, TraceConfig, "--stream-above-MiB", "parse larger files as a stream (memory grows with "
                      "the number of kernels, not the file)", field="stream_above_MiB")
    add_config_option(group, TraceConfig, "--show-ranks", "ranks whose own rows the tables list: all up to this "
                      "many, else the slowest by median step time (every rank is in the records)")
    add_config_option(group, TraceConfig, "--workers", "worker processes reading the rank files in parallel (0: one "
                      "per core, at most one per file)")
    add_config_option(group, TraceConfig, "--launch-bound-share", "a step is launch-bound when more than this share "
                      "of its kernels took longer to launch than to run")
    add_config_option(group, TraceConfig, "--system", "system preset or TOML whose peaks the roofline measures "
                      "against (default: the preset of the trace's device name, else the published peaks table)")
    group.add_argument("--progress", action="store_true", help="show a progress bar while reading")
    group.add_argument("--tally", nargs="?", const="api", choices=("api",), default=None, help="api (the default of "
                       "a bare --tally): THAPI-style tables instead of the analysis: host API "
                       "calls (CUDA runtime), device activity (NCCL kernels by name), memory operations (memcpy / "
                       "memset), collectives by message size; the files side by side (records: trace-tally)")
    add_output_options(parser, resume=False)
    group = parser.add_argument_group("plot")
    group.add_argument("--plot", default=None, help="draw a stacked bar per rank-step (GPU time by category and "
                       "idle) to this PNG/SVG/PDF path (default: none; `stepscope report` plots the records)")
    group.add_argument("--no-plot", action="store_true", help=argparse.SUPPRESS)  # the default since plots are asked


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, ProgressBar
    from stepscope.traces.run import run_trace

    config = TraceConfig(paths=tuple(args.paths), top=one_value(args.top, positive_int, "--top"),
                         show_ranks=one_value(args.show_ranks, positive_int, "--show-ranks"),
                         stream_above_MiB=one_value(args.stream_above_MiB, positive_float, "--stream-above-MiB"),
                         launch_bound_share=one_value(args.launch_bound_share, positive_float,
                                                      "--launch-bound-share"),
                         plot="" if args.no_plot else args.plot, system=args.system,
                         workers=one_value(args.workers, non_negative_int, "--workers"))
    if args.tally:
        return _run_tally(config, args)
    bar = ProgressBar("reading traces", unit="bytes", wanted=lambda total: args.progress or (
        sys.stderr.isatty() and total > PROGRESS_ABOVE_MiB * 2**20))
    try:
        outcome = run_trace(config, args.out, on_progress=bar.update)
    finally:
        bar.close()
    printer = Printer(args.format)
    shown = outcome.shown
    if len(shown) < len(outcome.ranks):
        printer.note(f"{len(outcome.ranks)} ranks ({sum(r.events for r in outcome.ranks):,} events); the tables list "
                     f"the {len(shown)} slowest by median step time (every rank is in the records; --show-ranks)")
    for rank in shown:
        printer.note(f"rank {rank.rank}: {rank.path} ({rank.device}, {rank.events:,} events, "
                     f"{len(rank.steps)} steps)")
    rows = outcome.step_rows()
    printer.emit(rows, title="per rank and step: GPU time (CPU ops for a CPU trace); step `all`: the rank's totals, "
                             "HTA's definitions (its step_ms: the mean of the steps it counts, the last left out)",
                 columns=[c for c in outcome.step_columns if any(row.get(c) is not None for row in rows)])
    categories = outcome.category_rows()
    printer.emit(categories, title="GPU kernel time by category (% of summed kernel time)",
                 columns=[c for c in categories[0] if c in ("rank", "step") or any(r[c] for r in categories)])
    if outcome.collective_rows():
        printer.emit(outcome.collective_rows(), title="collectives")
    if outcome.steps:
        printer.emit(outcome.rank_step_ms(), title="GPU step time per rank (ms)")
        printer.emit(outcome.straggler_rows(), title="across ranks: spread, slowest rank, waiting for it")
    paths = outcome.critical_path_rows()
    if paths:
        printer.emit(paths, title="critical path per rank-step: from the step's CPU start to its last GPU end, ms "
                                  "per category on the path and what bounds it")
    if outcome.paths:
        printer.emit(outcome.job_path_rows(), title="critical path per step across ranks: at each collective the "
                                                    "latest rank's work, then the transfer; the rank that set most")
    roofline = outcome.roofline_rows()
    if roofline:
        printer.emit(roofline, title=f"roofline: top {config.top} ops by GPU time (shapes recorded), achieved "
                                     "TFLOP/s and GB/s, % of the device's peak")
        printer.emit(outcome.roofline_totals(), title="roofline per op family (gemm: the matmul family's total)")
    for rank in shown:
        if not rank.shapes:
            printer.note(f"rank {rank.rank}: no shapes in the trace (record with record_shapes=True): no roofline")
        elif rank.roofline and rank.peaks and not rank.peaks.matrix:
            printer.note(f"rank {rank.rank}: {rank.peaks.source}: no % of peak")
    printer.emit(outcome.top_rows("kernels"), title=f"top {config.top} kernels per rank")
    printer.emit(outcome.top_rows("cpu_ops"), title=f"top {config.top} CPU ops per rank (inclusive time)")
    if outcome.plot is not None:
        printer.note(f"plot: {outcome.plot}")
    if outcome.path is not None:
        printer.note(f"records: {outcome.path}")
    return 0


def _run_tally(config: TraceConfig, args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.traces.tally import run_trace_tally
    from stepscope.traces.tally_report import flat_rows, headers, tables

    outcome = run_trace_tally(config, args.out)
    records = outcome.records()
    printer = Printer(args.format)
    if args.format in ("csv", "json"):
        printer.emit(flat_rows(records))
    else:
        for line in headers(records):
            printer.note(line)
        printer.note("")
        for title, rows in tables(records, top=config.top):
            printer.note(title)  # its own line: a table title would wrap at the table's width
            printer.emit(rows)
    if outcome.path is not None:
        printer.note(f"records: {outcome.path}")
    return 0
