"""`stepscope memory`: memory per phase of a training step, swept over sequence length and precision.
The work, the records and the timeline plots: `stepscope.measure.memory.benchmark.run_memory_sweep`."""

from __future__ import annotations

import argparse
import itertools

from stepscope.cli.options import (
    add_output_options,
    add_seed_option,
    add_threads_option,
    config_default,
    non_negative_int,
    positive_int,
    threads_list,
)
from stepscope.cli.options.model import add_model_options, add_workload_options, workload_grid
from stepscope.measure.memory.config import DEFAULT_MODES, STEP_WARMUP, MemoryConfig
from stepscope.measure.step.config import StepConfig

SUMMARY_COLUMNS = ["model", "batch", "seq", "mode", "precision", "attention", "threads", "status",
                   "init_current_MiB", "warm-up_current_MiB", "forward_peak_MiB", "backward_peak_MiB",
                   "optimizer_peak_MiB", "peak_MiB",
                   "optimizer_current_MiB", "residual_MiB", "timeline"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "memory", help="memory per phase (init, forward, backward, optimizer), timeline plot",
        description="Measure the bytes live after and the peak during init, forward, backward and the optimizer "
                    "step, for forward-only and the full train step by default. Comma lists sweep. Writes a "
                    "timeline PNG per point. CPU: profiler allocation events; CUDA: max_memory_allocated.")
    add_model_options(parser)
    add_workload_options(parser, StepConfig)
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
    add_seed_option(parser, StepConfig)
    add_threads_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, TableEmitter, effective_threads, memory_header
    from stepscope.measure.memory.benchmark import run_memory_sweep
    from stepscope.results.views import record_row

    configs = [MemoryConfig(
        step=StepConfig(model=spec, workload=workload, attention=attention, device=args.device, compile=args.compile,
                        warmup=args.warmup, iters=1, threads=threads, seed=args.seed), top=args.top)
        for (spec, workload, attention), threads in itertools.product(workload_grid(args), threads_list(args))]
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
        columns = [c for c in SUMMARY_COLUMNS if any(row.get(c) is not None for row in rows)]
        printer.emit(rows, title="memory sweep summary (MiB)", columns=columns)
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/memory.jsonl (--resume)")
    printer.note(f"records: {args.out}/memory.jsonl and {args.out}/memory-*.jsonl")
    return 0
