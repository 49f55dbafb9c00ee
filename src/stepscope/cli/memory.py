"""`stepscope memory`: memory per phase of a training step, swept over sequence length and precision."""

from __future__ import annotations

import argparse
import itertools

from stepscope.cli.options import (add_model_options, add_output_options, add_threads_option, non_negative_int,
                                   positive_int, threads_list)
from stepscope.cli.step import add_workload_options, workload_grid

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
    add_workload_options(parser)
    parser.set_defaults(mode="fwd,train")
    group = parser.add_argument_group("memory")
    group.add_argument("--warmup", type=non_negative_int, default=1,
                       help="full steps before the measured one (default 1: AdamW's state exists by then)")
    group.add_argument("--top", type=positive_int, default=10,
                       help="rows of the largest-allocations table (default 10)")
    group.add_argument("--plot-dir", default=None, help="folder for the timeline PNGs (default: the --out folder)")
    group.add_argument("--no-plot", action="store_true", help="do not write timeline PNGs")
    group.add_argument("--snapshot", default=None, metavar="FILE.pickle",
                       help="CUDA: write torch.cuda.memory._dump_snapshot (view at pytorch.org/memory_viz); "
                            "FILE.p<i>.pickle per sweep point")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    add_threads_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.memory import benchmark as memory
    from stepscope.measure.device import resolve_device
    from stepscope.measure.outputs import check_writable_dir, check_writable_file, point_path, rank_path
    from stepscope.measure.step.benchmark import StepConfig
    from stepscope.results.tables import TableEmitter, check_tables_writable, effective_threads
    from stepscope.results.store import check_results_folder

    configs = [memory.MemoryConfig(
        step=StepConfig(model=spec, workload=workload, attention=attention, device=args.device, compile=args.compile,
                        warmup=args.warmup, iters=1, threads=threads, seed=args.seed), top=args.top)
        for (spec, workload, attention), threads in itertools.product(workload_grid(args), threads_list(args))]
    for config in configs:
        config.validate()
    if args.snapshot is not None:
        if resolve_device(args.device).type != "cuda":
            raise UsageError("--snapshot needs a CUDA device (on CPU the timeline PNG shows the allocations)")
        for index in range(len(configs)):
            check_writable_file(rank_path(point_path(args.snapshot, index, len(configs))), "the snapshot")
    check_results_folder(args.out)  # before the plots, which default to it: `--out FILE` says "not a folder"
    plot_dir = None if args.no_plot else check_writable_dir(args.plot_dir or args.out, "timeline plots")
    check_tables_writable(args.out, ["memory", *memory.TABLE_KINDS])
    printer = Printer(args.format)
    emitter = TableEmitter(printer)
    timelines: dict[str, str] = {}
    show = emitter.on_record(memory_header)

    def on_record(record, config, result) -> None:
        if result is not None and result.plot_path is not None:
            timelines[record["key"]] = result.plot_path.name
        show(record, config, result)

    outcome = memory.run_memory_sweep(configs, args.out, resume=args.resume, plot_dir=plot_dir,
                                      snapshot=args.snapshot, on_record=on_record)
    emitter.finish()
    if len(outcome.records) > 1 and args.format in ("table", "md"):  # as `stepscope step`
        from stepscope.results.views import record_row

        rows = [{**record_row(r), "threads": effective_threads(r), "timeline": timelines.get(r["key"])}
                for r in outcome.records]
        columns = [c for c in SUMMARY_COLUMNS if any(row.get(c) is not None for row in rows)]
        printer.emit(rows, title="memory sweep summary (MiB)", columns=columns)
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/memory.jsonl (--resume)")
    printer.note(f"records: {args.out}/memory.jsonl and {args.out}/memory-*.jsonl")
    return 0


def memory_header(config, result) -> str:
    """The lines above a memory point's tables: the point, how memory was measured, the files written."""
    from stepscope.results.tables import point_title

    text = f"== {point_title(config.step)} ({result.device})\nmeasured: {result.method}"
    if result.plot_path is not None:
        text += f"\ntimeline: {result.plot_path}"
    if result.snapshot_path is not None:
        text += f"\nsnapshot: {result.snapshot_path}"
    return text
