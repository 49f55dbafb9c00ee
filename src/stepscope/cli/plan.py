"""`stepscope plan`: search every valid parallel plan, keep the feasible ones, print the best by throughput.
The work and the records: `stepscope.perfmodel.plan.run_plan`."""

from __future__ import annotations

import argparse
import sys

from stepscope.cli.options import (
    add_config_option,
    add_output_options,
    one_value,
    optional_value,
    positive_int,
)
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.options.perfmodel import (
    add_search_options,
    add_system_option,
    add_training_options,
    space_from_args,
    training_from_args,
)
from stepscope.errors import UsageError
from stepscope.perfmodel.plan import PlanConfig

NAME = "plan"
HELP = "search parallel plans and rank the feasible ones"
DESCRIPTION = ("Enumerate every valid (tp, pp, dp, cp, micro-batch, ZeRO stage, shard group, recompute, interleave, "
               "stage layout, placement) for a model on N GPUs, evaluate them vectorized, and print the fastest plans "
               "that fit in memory.")


PROGRESS_ABOVE = 2_000_000  # candidates: smaller searches finish before a bar would be useful


def add_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, default="gpt3-175b")
    add_system_option(parser, PlanConfig)
    add_training_options(parser)
    add_search_options(parser)
    add_config_option(parser, PlanConfig, "--top", "how many plans to print")
    parser.add_argument("--explain", action="store_true", help="print how many candidates each rule rejected")
    add_config_option(parser, PlanConfig, "--workers", "evaluation processes, or all (one per CPU)", none="all")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, ProgressBar
    from stepscope.perfmodel.plan import run_plan

    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError("plan searches one model at a time (give one --model and single override values)")
    gpus = optional_value(args.gpus, positive_int, "--gpus")
    if gpus is None:
        raise UsageError("plan needs --gpus")
    training = training_from_args(args)
    if training.global_batch is None:
        raise UsageError("plan needs --global-batch")
    config = PlanConfig(model=specs[0], workload=training.workload(specs[0]), gpus=gpus, system=args.system,
                        space=space_from_args(args), top=one_value(args.top, positive_int, "--top"),
                        workers=None if args.workers == "all" else one_value(args.workers, positive_int, "--workers"))
    bar = (ProgressBar("evaluating", wanted=lambda total: total >= PROGRESS_ABOVE)
           if not args.no_progress and sys.stderr.isatty() else None)
    try:
        outcome = run_plan(config, args.out, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    printer = Printer(args.format)
    printer.note(outcome.summary())
    if args.explain or not outcome.result.top:
        printer.emit(outcome.rejected_rows(),
                     title="why candidates were rejected (rejected: under the first rule broken, in this order; "
                           "with the feasible they add up to all candidates; breaking: every candidate breaking the "
                           "rule)")
    if not outcome.result.top:
        raise UsageError(outcome.result.why_none())
    rows = outcome.rows()
    printer.emit(rows, title=f"top {len(rows)} feasible plans by throughput (equivalent: other plans with the same "
                             "prediction, e.g. another placement of the same groups)")
    printer.note(f"records: {outcome.path}")
    return 0
