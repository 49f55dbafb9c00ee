"""`stepscope compare`: measured step records next to the model's prediction, error per phase.
The work and the records: `stepscope.perfmodel.validate.compare.run_compare`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_output_options
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.options.perfmodel import (
    add_plan_options,
    add_records_options,
    add_system_option,
    add_training_options,
    plan_from_args,
)
from stepscope.errors import UsageError
from stepscope.perfmodel.validate.compare import CompareConfig

NAME = "compare"
HELP = "measured step records next to predictions, error per phase"
DESCRIPTION = ("Predict every measured `step` record (same model, batch, sequence, precision, mode, attention) on a "
               "system and print the error per phase. Repeated measurements of one configuration are merged. With "
               "--kind trace: the `trace` records of a GPU run (stepscope trace) next to the prediction of the run's "
               "model and plan (--model, the plan and workload options, --system): step time, compute, exposed "
               "communication.")


COLUMNS = ["model", "n_layers", "batch", "seq", "precision", "forward_measured_ms", "forward_predicted_ms",
           "forward_error_pct", "backward_measured_ms", "backward_predicted_ms", "backward_error_pct",
           "optimizer_measured_ms", "optimizer_predicted_ms", "optimizer_error_pct", "step_error_pct"]


def add_options(parser: argparse.ArgumentParser) -> None:
    add_records_options(parser, CompareConfig)
    add_system_option(parser, CompareConfig)
    group = parser.add_argument_group("traces of GPU runs (--kind trace)")
    group.add_argument("--kind", default="step", choices=("step", "trace"),
                       help="the records compared: step (measured steps, each predicted alike), or trace (the `trace` "
                            "records, with the prediction of --model and the plan and workload options below, on "
                            "--system) (default %(default)s)")
    old = group.add_argument("--trace", dest="kind", action="store_const", const="trace", default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)
    old.alias_of = "--kind"  # formerly the flag of `--kind trace` (docs/vocabulary.md)
    add_model_options(parser)
    add_training_options(parser)
    add_plan_options(parser)
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.validate.compare import run_compare

    if args.kind == "trace":
        return _run_trace(args)

    outcome = run_compare(CompareConfig(records=tuple(args.records), where=tuple(args.where), system=args.system),
                          args.out)
    printer = Printer(args.format)
    rows = outcome.rows()
    printer.emit(rows, title=f"measured vs predicted on {outcome.system.name}",
                 columns=[c for c in COLUMNS if any(c in r for r in rows)])
    printer.emit(outcome.summary(), title="absolute error per phase")
    for note in outcome.notes():
        printer.note(note)
    printer.note(f"records: {outcome.path}")
    return 0


def _run_trace(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.validate.trace_compare import TraceCompareConfig, run_trace_compare

    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError("--trace compares one run: give one --model")
    plan, workload = plan_from_args(args, specs[0])
    outcome = run_trace_compare(TraceCompareConfig(model=specs[0], workload=workload, plan=plan,
                                                   records=tuple(args.records), where=tuple(args.where),
                                                   system=args.system), args.out)
    printer = Printer(args.format)
    printer.emit(outcome.rows(), title=f"trace vs prediction on {outcome.prediction.system} (median over each rank's "
                                       "steps)")
    if outcome.categories:
        printer.emit(outcome.categories, title="per category (ms per step; docs/traces.md: calibrate --trace)")
    printer.note(f"records: {outcome.path}")
    return 0
