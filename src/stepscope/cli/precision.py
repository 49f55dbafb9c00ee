"""`stepscope precision accumulate|dtypes`: the two classic mixed-precision experiments.
The work and the records: `stepscope.measure.precision.experiments` (`run_accumulate`, `run_dtypes`)."""

from __future__ import annotations

import argparse

from stepscope.cli.options import (
    add_device_option,
    add_output_options,
    add_subcommands,
    config_default,
    field_default,
)
from stepscope.cli.options.model import add_model_options, model_specs, overrides_given
from stepscope.measure.precision.config import AccumulateConfig, DtypesConfig

NAME = "precision"
HELP = "mixed-precision experiments (accumulate, dtypes)"
DESCRIPTION = "Mixed-precision experiments."


def add_options(parser: argparse.ArgumentParser) -> None:
    """The experiments, each a subcommand with its own `run` (a group command has none of its own)."""
    commands = add_subcommands(parser, "precision_command", "EXPERIMENT")
    acc = commands.add_parser("accumulate", help="add 0.01 a thousand times in several dtypes")
    acc.add_argument("--steps", type=int, default=field_default(AccumulateConfig, "steps"),
                     help="additions (default %(default)s)")
    acc.add_argument("--increment", type=float, default=field_default(AccumulateConfig, "increment"),
                     help="the value added (default %(default)s)")
    add_output_options(acc, resume=False)
    acc.set_defaults(func=run_accumulate)

    dtypes = commands.add_parser("dtypes", help="dtypes of parameters, outputs and gradients under autocast")
    add_model_options(dtypes, default="toy")
    dtypes.add_argument("--precision", default=config_default(DtypesConfig, "precision"), choices=["bf16", "fp16"],
                        help="autocast dtype (default %(default)s)")
    add_device_option(dtypes, DtypesConfig)
    add_output_options(dtypes, resume=False)
    dtypes.set_defaults(func=run_dtypes)


def run_accumulate(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.precision.experiments import run_accumulate as experiment

    rows = experiment(AccumulateConfig(steps=args.steps, increment=args.increment), args.out)
    Printer(args.format).emit(rows, title=f"sum of {args.increment} x {args.steps} (exact "
                                          f"{args.increment * args.steps:g})")
    return 0


def run_dtypes(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.precision.experiments import run_dtypes as experiment

    if args.model == "toy":
        if overrides_given(args):
            raise UsageError("the toy model takes no field overrides (use a preset, e.g. --model tiny)")
        spec = None
    else:
        specs = model_specs(args)
        if len(specs) != 1:
            raise UsageError("precision dtypes takes one model (no comma lists)")
        spec = specs[0]
    config = DtypesConfig(model=spec, precision=args.precision, device=args.device)
    result = experiment(config, args.out)
    printer = Printer(args.format)
    printer.emit(result.modules, title=f"{args.model} under {args.precision} autocast on {result.device}")
    printer.note(f"loss dtype: {result.loss_dtype}")
    return 0
