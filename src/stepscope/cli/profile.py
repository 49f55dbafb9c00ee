"""`stepscope profile`: where a step's time goes, by category and op, for the same workloads as `step`."""

from __future__ import annotations

import argparse
import fnmatch
import itertools
from pathlib import Path

from stepscope.cli.options import (add_model_options, add_output_options, add_threads_option, non_negative_int,
                                   positive_int, threads_list)
from stepscope.cli.step import add_workload_options, workload_grid


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile", help="profile a training step: time by category and op, timer vs profiler",
        description="Run a training step under torch.profiler (schedule: wait, warm-up, active steps) and "
                    "break the time of forward, forward+backward and the train step down by category "
                    "(matmul, attention, softmax, ...) and op. Comma lists sweep.")
    add_model_options(parser)
    add_workload_options(parser)
    group = parser.add_argument_group("profiler")
    group.add_argument("--wait", type=non_negative_int, default=0,
                       help="steps before the profiler's warm-up (default 0)")
    group.add_argument("--warmup", type=non_negative_int, default=1,
                       help="steps recorded then discarded, to settle the profiler (default 1)")
    group.add_argument("--active", type=positive_int, default=2, help="steps recorded and analysed (default 2)")
    group.add_argument("--iters", type=positive_int, default=3,
                       help="steps timed afterwards without the profiler, for timer vs profiler (default 3)")
    group.add_argument("--top", type=positive_int, default=10, help="rows of the top-ops tables (default 10)")
    group.add_argument("--trace", default=None, metavar="FILE",
                       help="write the Chrome/Perfetto trace of the active steps (FILE.p<i>.json per sweep point, "
                            "FILE.rank<r>.json per rank when distributed)")
    group.add_argument("--nvtx", action="store_true",
                       help="also NVTX ranges per phase and one `stepscope.active` range (CUDA, Nsight Systems)")
    group.add_argument("--memory", action="store_true",
                       help="also measure memory per phase for each point (as `stepscope memory`)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    add_threads_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.memory import benchmark as memory
    from stepscope.measure.profile import benchmark as profile
    from stepscope.measure.outputs import check_writable_file, point_path, rank_path
    from stepscope.measure.step.benchmark import StepConfig
    from stepscope.results.tables import TableEmitter, check_tables_writable, point_title

    configs = [profile.ProfileConfig(
        step=StepConfig(model=spec, workload=workload, attention=attention, device=args.device, compile=args.compile,
                        warmup=args.warmup, iters=args.iters, threads=threads, seed=args.seed),
        wait=args.wait, active=args.active, top=args.top, nvtx=args.nvtx)
        for (spec, workload, attention), threads in itertools.product(workload_grid(args), threads_list(args))]
    for config in configs:
        config.validate()
    naive = any(config.step.attention == "naive" for config in configs)
    kinds = ["profile", *(k for k in profile.TABLE_KINDS if naive or k != "profile-attention")]
    kinds += ["memory", *memory.TABLE_KINDS] if args.memory else []
    if args.trace is not None:
        traces = [rank_path(point_path(args.trace, index, len(configs))) for index in range(len(configs))]
        check_trace_apart(args.trace, traces, args.out, plots=args.memory)
        for path in traces:
            check_writable_file(path, "the trace")
    check_tables_writable(args.out, kinds)
    printer = Printer(args.format)
    emitter = TableEmitter(printer)

    def header(config, result) -> str:
        text = f"== {point_title(config.step)} ({result.device}, {result.threads} threads, " \
               f"{config.active} active steps; time in ops = {result.source})"
        return text + (f"\ntrace: {result.trace_path}" if result.trace_path is not None else "")

    outcome = profile.run_profile_sweep(configs, args.out, resume=args.resume, trace=args.trace,
                                        on_record=emitter.on_record(header))
    if args.memory:
        from stepscope.cli.memory import memory_header

        memory.run_memory_sweep([memory.MemoryConfig(step=config.step, top=config.top) for config in configs],
                                args.out, resume=args.resume, plot_dir=args.out,
                                on_record=emitter.on_record(memory_header))
    emitter.finish()
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/profile.jsonl (--resume)")
    printer.note(f"records: {args.out}/profile.jsonl and {args.out}/profile-*.jsonl")
    return 0


def check_trace_apart(trace: str, paths: list[Path], out: str, *, plots: bool) -> None:
    """Refuse trace files that would be the results folder, contain it, or take a name the folder uses for
    its own files (`*.jsonl` records, which `stepscope show` reads; with --memory the `memory-*.png`
    timelines): the trace's own check passes while --out does not exist yet, and then one write fails or
    overwrites the other."""
    from stepscope.errors import UsageError

    folder = Path(out).resolve()
    example = Path(out) / "trace.json"
    for path in paths:
        target = path.resolve()
        if target == folder or target in folder.parents:
            raise UsageError(f"--trace {trace} collides with the results folder --out {out}: name a trace file "
                             f"of its own (e.g. {example})")
        if target.parent == folder and (target.suffix == ".jsonl"
                                        or (plots and fnmatch.fnmatch(target.name, "memory-*.png"))):
            owned = "*.jsonl records" + (", memory-*.png timelines" if plots else "")
            raise UsageError(f"--trace {trace} would write {path}, a name the results folder --out {out} uses for "
                             f"its own files ({owned}): name the trace e.g. {example}")
