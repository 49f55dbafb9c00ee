"""`stepscope profile`: where a step's time goes, by category and op, for the same workloads as `step`.
The work and the records: `stepscope.measure.profile.benchmark.run_profile_sweep`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import (
    add_output_options,
    config_default,
    non_negative_int,
    positive_int,
)
from stepscope.cli.options.model import add_step_options, step_configs
from stepscope.measure.profile.config import STEP_ITERS, STEP_WARMUP, ProfileConfig

NAME = "profile"
HELP = "profile a training step: time by category and op, timer vs profiler"
DESCRIPTION = ("Run a training step under torch.profiler (schedule: wait, warm-up, active steps) and break the time "
               "of forward, forward+backward and the train step down by category (matmul, attention, softmax, ...) "
               "and op. Comma lists sweep.")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_step_options(parser)
    group = parser.add_argument_group("profiler")
    group.add_argument("--wait", type=non_negative_int, default=config_default(ProfileConfig, "wait"),
                       help="steps before the profiler's warm-up (default %(default)s)")
    group.add_argument("--warmup", type=non_negative_int, default=STEP_WARMUP,
                       help="steps recorded then discarded, to settle the profiler (default %(default)s)")
    group.add_argument("--active", type=positive_int, default=config_default(ProfileConfig, "active"),
                       help="steps recorded and analysed (default %(default)s)")
    group.add_argument("--iters", type=positive_int, default=STEP_ITERS,
                       help="steps timed afterwards without the profiler, for timer vs profiler (default %(default)s)")
    group.add_argument("--top", type=positive_int, default=config_default(ProfileConfig, "top"),
                       help="rows of the top-ops tables (default %(default)s)")
    group.add_argument("--trace", default=None, metavar="FILE",
                       help="write the Chrome/Perfetto trace of the active steps (FILE.p<i>.json per sweep point, "
                            "FILE.rank<r>.json per rank when distributed)")
    group.add_argument("--nvtx", action="store_true",
                       help="also NVTX ranges per phase and one `stepscope.active` range (CUDA, Nsight Systems)")
    group.add_argument("--memory", action="store_true",
                       help="also measure memory per phase for each point (as `stepscope memory`)")
    add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, TableEmitter, memory_header, point_title
    from stepscope.measure.profile.benchmark import run_profile_sweep

    configs = [ProfileConfig(step=step, wait=args.wait, active=args.active, top=args.top, nvtx=args.nvtx)
               for step in step_configs(args, [args.warmup], [args.iters])]
    printer = Printer(args.format)
    emitter = TableEmitter(printer)

    def header(config, result) -> str:
        text = f"== {point_title(config.step)} ({result.device}, {result.threads} threads, " \
               f"{config.active} active steps; time in ops = {result.source})"
        return text + (f"\ntrace: {result.trace_path}" if result.trace_path is not None else "")

    outcome = run_profile_sweep(configs, args.out, resume=args.resume, trace=args.trace, with_memory=args.memory,
                                on_record=emitter.on_record(header), on_memory_record=emitter.on_record(memory_header))
    emitter.finish()
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/profile.jsonl (--resume)")
    printer.note(f"records: {args.out}/profile.jsonl and {args.out}/profile-*.jsonl")
    return 0
