"""`stepscope predict`: one parallel plan -> step time, tokens/s, MFU, memory and the per-phase breakdown.
The work and the records: `stepscope.perfmodel.predict.run_predict`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_config_option, add_output_options, choice, one_value
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.options.perfmodel import (
    add_plan_options,
    add_system_option,
    add_training_options,
    plan_from_args,
)
from stepscope.perfmodel.predict import BUCKET_RULES, PredictConfig, PredictPoint

NAME = "predict"
HELP = "predict a training step of one parallel plan"
DESCRIPTION = ("Predict step time, throughput, MFU and memory of one plan on a system, with the breakdown by cause. "
               "Comma lists of models sweep.")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    add_system_option(parser, PredictConfig)
    add_training_options(parser)
    add_plan_options(parser)
    group = parser.add_argument_group("gradient buckets")
    add_config_option(group, PredictConfig, "--bucket-MiB", "gradient bucket size for the overlap rule")
    add_config_option(group, PredictConfig, "--buckets", "gradient bucket layout: size (size-based estimate), or "
                      "torch|strict: the DDP bucket planner's layout of this model's gradients, "
                      "stepscope.spec.buckets")
    parser.add_argument("--per-layer", action="store_true", help="also print the per-op table of one layer")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.predict import run_predict

    points = []
    for spec in model_specs(args):
        plan, workload = plan_from_args(args, spec)
        points.append(PredictPoint(model=spec, workload=workload, plan=plan))
    config = PredictConfig(points=tuple(points), system=args.system,
                           bucket_MiB=one_value(args.bucket_MiB, float, "--bucket-MiB"),
                           buckets=one_value(args.buckets, choice(*BUCKET_RULES), "--buckets"),
                           per_layer=args.per_layer)
    outcome = run_predict(config, args.out)
    printer = Printer(args.format)
    for step in outcome.steps:
        printer.note(step.title())  # a line of its own: a table title would wrap at the table's width
        printer.emit([step.totals()])
        printer.emit(step.breakdown_rows(), title="where the step goes")
        printer.emit(step.memory_rows(), title="memory per GPU")
        if step.per_layer is not None:
            printer.emit(step.per_layer, title="per layer: one GPU, one micro-batch; blocks summed over a stage's "
                                               "layers")
    printer.note(f"records: {outcome.path}")
    return 0
