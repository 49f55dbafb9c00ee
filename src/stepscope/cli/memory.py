"""`stepscope memory`: memory per phase of a training step, swept over sequence length and precision.
The work, the records and the timeline plots: `stepscope.measure.memory.benchmark.run_memory_sweep`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import (
    add_output_options,
    config_default,
    non_negative_int,
    positive_int,
)
from stepscope.cli.options.model import add_step_options, step_configs
from stepscope.measure.memory.config import DEFAULT_MODES, STEP_WARMUP, MemoryConfig

NAME = "memory"
HELP = "memory per phase (init, forward, backward, optimizer), timeline plot"
DESCRIPTION = ("Measure the bytes live after and the peak during init, forward, backward and the optimizer step, "
               "for forward-only and the full train step by default. Comma lists sweep. Writes a timeline PNG per "
               "point. CPU: profiler allocation events; CUDA: max_memory_allocated.")


SUMMARY_COLUMNS = ["model", "batch", "seq", "mode", "precision", "attention", "threads", "status",
                   "init_current_MiB", "warm-up_current_MiB", "forward_peak_MiB", "backward_peak_MiB",
                   "optimizer_peak_MiB", "peak_MiB",
                   "optimizer_current_MiB", "residual_MiB", "timeline"]


def add_options(parser: argparse.ArgumentParser) -> None:
    add_step_options(parser)
    parser.set_defaults(mode=",".join(DEFAULT_MODES))
    group = parser.add_argument_group("memory")
    group.add_argument("--warmup", type=non_negative_int, default=STEP_WARMUP,
                       help="full steps before the measured one (default %(default)s: AdamW's state exists by then)")
    group.add_argument("--top", type=positive_int, default=config_default(MemoryConfig, "top"),
                       help="rows of the largest-allocations table (default %(default)s)")
    group.add_argument("--plot-dir", default=None, help="folder for the timeline PNGs (default: the --out folder)")
    group.add_argument("--no-plot", action="store_true", help="do not write timeline PNGs")
    group.add_argument("--snapshot", default=None, metavar="FILE.pickle",
                       help="CUDA: write torch.cuda.memory._dump_snapshot (view at pytorch.org/memory_viz); "
                            "FILE.p<i>.pickle per sweep point")
    add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, TableEmitter, effective_threads, memory_header, summary_columns
    from stepscope.measure.memory.benchmark import run_memory_sweep
    from stepscope.results.views import record_row

    configs = [MemoryConfig(step=step, top=args.top) for step in step_configs(args, [args.warmup], [1])]
    printer = Printer(args.format)
    emitter = TableEmitter(printer)
    timelines: dict[str, str] = {}
    show = emitter.on_record(memory_header)

    def on_record(record, config, result) -> None:
        if result is not None and result.plot_path is not None:
            timelines[record["key"]] = result.plot_path.name
        show(record, config, result)

    outcome = run_memory_sweep(configs, args.out, resume=args.resume,
                               plot_dir=None if args.no_plot else (args.plot_dir or args.out),
                               snapshot=args.snapshot, on_record=on_record)
    emitter.finish()
    if len(outcome.records) > 1 and args.format in ("table", "md"):  # as `stepscope step`
        rows = [{**record_row(r), "threads": effective_threads(r), "timeline": timelines.get(r["key"])}
                for r in outcome.records]
        printer.emit(rows, title="memory sweep summary (MiB)", columns=summary_columns(rows, SUMMARY_COLUMNS))
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/memory.jsonl (--resume)")
    printer.note(f"records: {args.out}/memory.jsonl and {args.out}/memory-*.jsonl")
    return 0
