"""`stepscope validate`: predict the published measured runs shipped with stepscope, print the errors.
The work and the records: `stepscope.perfmodel.validate.validate.run_validate`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_config_option, add_output_options, choice, one_value
from stepscope.cli.options.perfmodel import add_system_option
from stepscope.perfmodel.validate.validate import BY, DATASETS, ValidateConfig

NAME = "validate"
HELP = "predict published measured runs and print the error"
DESCRIPTION = ("Predict every published run of a dataset shipped with stepscope (Narayanan et al. 2021, Table 1: "
               "Megatron-LM GPT 1.7B-1T on up to 3072 A100s; modern dense runs; Mixture-of-Experts runs) from first "
               "principles and print predicted vs measured; --cross-validate also predicts each run with its system "
               "calibrated on the dataset's other runs of that system.")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_system_option(parser, ValidateConfig)
    add_config_option(parser, ValidateConfig, "--dataset", f"one of {', '.join(DATASETS)}, all, or your own CSV in "
                      "the modern_runs schema (docs/validation-data.md)")
    add_config_option(parser, ValidateConfig, "--by", "run: a row per run | source: a row per publication, with "
                      "the error after one factor per source and with each source left out | trend: the published "
                      "ratio between two runs (scaling, fp8, long context) beside the model's")
    parser.add_argument("--cross-validate", action="store_true",
                        help="also predict each run with its system calibrated on the other runs of that system "
                             "(leave one out: the error to expect after calibrating on your own runs)")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.validate.validate import run_validate

    config = ValidateConfig(system=args.system, dataset=one_value(args.dataset, str, "--dataset"),
                            by=one_value(args.by, choice(*BY), "--by"), cross_validate=args.cross_validate)
    outcome = run_validate(config, args.out)
    printer = Printer(args.format)
    if config.by == "source":
        printer.emit(outcome.sources(), title=f"{outcome.dataset}: error by source (one factor per source; each "
                                              f"source left out)")
    elif config.by == "trend":
        printer.emit(outcome.trends(), title=f"{outcome.dataset}: published and predicted ratios between runs")
    else:
        printer.emit([r.row() for r in outcome.rows], title=outcome.title())
    printer.note(outcome.summary())
    printer.note(f"records: {outcome.path}")
    return 0
