"""`stepscope plan`: search every valid parallel plan, keep the feasible ones, print the best by throughput.
The work and the records: `stepscope.perfmodel.plan.run_plan`."""

from __future__ import annotations

import argparse
import sys

from stepscope.cli.options import (
    add_config_option,
    add_output_options,
    choice,
    config_default,
    non_negative_int,
    one_value,
    optional_value,
    parse_list,
    positive_int,
    yes_no,
)
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.options.perfmodel import (
    add_system_option,
    add_training_options,
    switches_from_args,
    training_from_args,
)
from stepscope.errors import UsageError
from stepscope.perfmodel.plan import PlanConfig
from stepscope.perfmodel.search import SearchSpace
from stepscope.spec.plan import FP8_RECIPES, RECOMPUTE

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
    group = parser.add_argument_group("search space (comma lists; default: every value that can be valid)")
    for name, default in (("tp", "divisors of --gpus"), ("pp", "divisors of --gpus"), ("cp", "divisors of --gpus"),
                          ("micro-batch", "divisors of --global-batch")):
        group.add_argument(f"--{name}", default=config_default(SearchSpace, name.replace("-", "_")),
                           help=f"{name} values to try (default {default})")
    for option, help_text, field in (("--interleave", "interleave values to try", None),
                                     ("--zero", "ZeRO stages to try", None),
                                     ("--recompute", "recompute modes to try", None),
                                     ("--sequence-parallel", "sequence parallelism: no, yes, or no,yes", None),
                                     ("--flash", "fused flash attention: yes, no, or no,yes", "flash_attention"),
                                     ("--shard-group", "ZeRO/FSDP shard group sizes to try (0: all dp x cp ranks; "
                                      "smaller: HSDP)", None),
                                     ("--uneven-stages", "also try first/last stages one layer shorter: yes|no", None),
                                     ("--reshard-after-forward", "ZeRO-3/FSDP gathers weights again for backward: "
                                      "yes|no", None),
                                     ("--fp8-recipe", f"scaling of fp8 GEMMs with --precision fp8: "
                                      f"{'|'.join(FP8_RECIPES)}", None)):
        add_config_option(group, SearchSpace, option, help_text, field=field)
    group.add_argument("--no-placements", action="store_true",
                       help="only Megatron's rank order (tp, cp, dp, pp) instead of every placement")
    add_config_option(parser, PlanConfig, "--top", "how many plans to print")
    parser.add_argument("--explain", action="store_true", help="print how many candidates each rule rejected")
    add_config_option(parser, PlanConfig, "--threads", "evaluation threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_output_options(parser, resume=False)


def space_from_args(args: argparse.Namespace) -> SearchSpace:
    """The search space options as a `SearchSpace`."""

    def ints(option: str, text: str | None) -> tuple[int, ...] | None:
        return None if text is None else tuple(parse_list(text, positive_int, option))

    def switches(option: str, text: str) -> tuple[bool, ...]:
        return tuple(yes_no(v, option) for v in parse_list(text, str, option))

    zero = tuple(parse_list(args.zero, int, "--zero"))
    if any(z not in (0, 1, 2, 3) for z in zero):
        raise UsageError(f"--zero values must be 0, 1, 2 or 3, got {args.zero}")
    return SearchSpace(tp=ints("--tp", args.tp), pp=ints("--pp", args.pp), cp=ints("--cp", args.cp),
                       micro_batch=ints("--micro-batch", args.micro_batch),
                       interleave=ints("--interleave", args.interleave),
                       zero=zero, recompute=tuple(parse_list(args.recompute, choice(*RECOMPUTE), "--recompute")),
                       sequence_parallel=switches("--sequence-parallel", args.sequence_parallel),
                       flash_attention=switches("--flash", args.flash), placements=not args.no_placements,
                       shard_group=tuple(parse_list(args.shard_group, non_negative_int, "--shard-group")),
                       uneven_stages=yes_no(args.uneven_stages, "--uneven-stages"),
                       reshard_after_forward=yes_no(args.reshard_after_forward, "--reshard-after-forward"),
                       fp8_recipe=one_value(args.fp8_recipe, choice(*FP8_RECIPES), "--fp8-recipe"),
                       **switches_from_args(args))


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
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
                        threads=one_value(args.threads, positive_int, "--threads"))
    bar = _ProgressBar() if not args.no_progress and sys.stderr.isatty() else None
    try:
        outcome = run_plan(config, args.out, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    printer = Printer(args.format)
    printer.note(outcome.summary())
    if args.explain or not outcome.result.top:
        printer.emit(outcome.rejected_rows(),
                     title="why candidates were rejected (a candidate may break several rules)")
    if not outcome.result.top:
        raise UsageError(outcome.result.why_none())
    rows = outcome.rows()
    printer.emit(rows, title=f"top {len(rows)} feasible plans by throughput (equivalent: other plans with the same "
                             "prediction, e.g. another placement of the same groups)")
    printer.note(f"records: {outcome.path}")
    return 0


class _ProgressBar:
    """A rich progress bar on stderr, shown only for large searches."""

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def update(self, done: int, total: int) -> None:
        if total < PROGRESS_ABOVE:
            return
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._progress = Progress("evaluating", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("plans", total=total)
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
