"""`stepscope calibrate`: fit a system (efficiency curve, kernel overhead, bandwidth, links) to measured records.
The work, the system TOML and the records: `stepscope.perfmodel.calibrate.run.run_calibrate`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_config_option, add_output_options, one_value, parse_list
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.options.perfmodel import (
    add_plan_options,
    add_records_options,
    add_system_option,
    add_training_options,
    plan_from_args,
)
from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.measured import MAX_EFFICIENCY_LIMIT
from stepscope.perfmodel.calibrate.published import PublishedCalibrationConfig
from stepscope.perfmodel.calibrate.run import CalibrateConfig
from stepscope.perfmodel.validate.datasets import DATASETS

NAME = "calibrate"
HELP = "fit a system TOML to measured records, published runs or measured op rates"
DESCRIPTION = ("Fit the compute-efficiency curve, per-kernel overhead, streaming bandwidth and elementwise rate of "
               "a system to stepscope's own step records (least squares), plus flash efficiency from attention "
               "records and link α/β from comm records when present; or one curve factor to published runs "
               "(--published); or the curve top, flash and fp8 efficiency to a GPU's measured op rates (--rates). "
               "Writes a system TOML that predict, plan and compare accept.")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_records_options(parser, CalibrateConfig)
    add_system_option(parser, CalibrateConfig, "--base", "base", help="system preset or TOML the fit starts from")
    for option, help_text in (
            ("--system-out", "where to write the fitted system TOML"), ("--name", "name of the fitted system"),
            ("--knots", "efficiency-curve knots in GFLOP, a comma list"),
            ("--prior-weight", "pull of the elementwise rate, bandwidth and kernel overhead toward --base, in units "
                               "of one phase's relative error; 0: none"),
            ("--max-efficiency", "cap of the efficiency curve, as a fraction of the measured large-GEMM rate; at "
                                 f"most {MAX_EFFICIENCY_LIMIT:g}, a margin for a peak measurement that ran slow")):
        add_config_option(parser, CalibrateConfig, option, help_text)
    published = parser.add_argument_group("from published end-to-end runs instead of records")
    published.add_argument("--published", default=None, metavar="DATASET",
                           help=f"fit the compute efficiency of the runs' training stack to some runs of a shipped "
                                f"dataset ({', '.join(DATASETS)}, all) or of your own CSV in its schema, and "
                                f"predict the stack's other runs")
    published.add_argument("--runs", default=None, help="run labels to fit (comma list; with --published)")
    add_config_option(published, PublishedCalibrationConfig, "--stack-out",
                      "where --published writes the fitted stack TOML (use it with --stack)")
    rates = parser.add_argument_group("from measured op rates instead of records")
    rates.add_argument("--rates", default=None, metavar="FILES",
                       help="records of `stepscope op-rates` (comma list of folders or files): the "
                            "curve's top, flash and fp8 efficiency of --base (the GPU's preset) from its rates at a "
                            "model's own shapes")
    traced = parser.add_argument_group("from profiler traces of your own run instead of records (--trace)")
    traced.add_argument("--trace", default=None, metavar="FILES",
                        help="Kineto traces of one job (comma list of files or folders): the efficiency curve, "
                             "flash and memory efficiency from the ops' recorded shapes, link alpha/beta from the "
                             "NCCL kernels' sizes; with --model and the traced run's workload and plan options, "
                             "also fitted so the model reproduces the trace's per-category times (--base: default "
                             "the preset of the traced device)")
    add_model_options(parser)
    add_training_options(parser)
    add_plan_options(parser)
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.calibrate.run import run_calibrate

    if args.published is not None:
        return run_published(args)
    if args.rates is not None:
        return run_rates(args)
    if args.trace is not None:
        return run_trace(args)

    config = CalibrateConfig(records=tuple(args.records), where=tuple(args.where), base=args.base,
                             system_out=args.system_out, name=args.name,
                             knots=tuple(parse_list(args.knots, float, "--knots")),
                             prior_weight=one_value(args.prior_weight, float, "--prior-weight"),
                             max_efficiency=one_value(args.max_efficiency, float, "--max-efficiency"))
    outcome = run_calibrate(config, args.out)
    printer = Printer(args.format)
    printer.note(outcome.headline())
    printer.emit(outcome.parameter_rows())
    printer.emit(outcome.fit_error(), title="fit error on the calibration records themselves (in-sample)")
    for note in outcome.notes():
        printer.note(note)
    printer.note(f"system: {outcome.system_out}  (use it with --system {outcome.system_out})")
    printer.note(f"records: {outcome.path}")
    return 0


def run_published(args: argparse.Namespace) -> int:
    """`--published DATASET --runs ...`: one efficiency factor from end-to-end runs, the others predicted."""
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.calibrate.published import run_calibrate_published

    if args.runs is None:
        raise UsageError("--published needs --runs (the run labels to fit)")
    config = PublishedCalibrationConfig(dataset=one_value(args.published, str, "--published"),
                                        runs=tuple(parse_list(args.runs, str, "--runs")), stack_out=args.stack_out)
    outcome = run_calibrate_published(config, args.out)
    printer = Printer(args.format)
    printer.note(f"{outcome.base.name}: compute efficiency x {outcome.factor:.4f}, fitted to {', '.join(config.runs)}")
    printer.emit(outcome.rows, title="every run of that stack: error before (base) and after (fitted)")
    printer.emit(outcome.summary(), title="fit (in-sample) and held-out (out-of-sample) error")
    printer.note(f"stack: {outcome.stack_out}  (use it with --stack {outcome.stack_out})")
    printer.note(f"records: {outcome.path}")
    return 0


def run_rates(args: argparse.Namespace) -> int:
    """`--rates FILES`: the curve top, flash and fp8 efficiency of --base from measured op rates."""
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.calibrate.rates import RatesCalibrationConfig, run_calibrate_rates

    config = RatesCalibrationConfig(rates=tuple(parse_list(args.rates, str, "--rates")), base=args.base,
                                    system_out=args.system_out, name=args.name)
    outcome = run_calibrate_rates(config, args.out)
    printer = Printer(args.format)
    printer.note(f"{outcome.base.name} refined by the measured op rates of {', '.join(config.rates)}")
    printer.emit(outcome.rows)
    printer.note(f"system: {outcome.system_out}  (use it with --system {outcome.system_out})")
    printer.note(f"records: {outcome.path}")
    return 0


def run_trace(args: argparse.Namespace) -> int:
    """`--trace FILES [--model M ...]`: analyse the traces, fit a system to their records, write it."""
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.calibrate.trace_run import TraceCalibrationConfig, run_calibrate_trace
    from stepscope.traces.run import write_trace_records

    model = workload = plan = None
    if args.model is not None:
        specs = model_specs(args)
        if len(specs) != 1:
            raise UsageError("--trace fits one run: give one --model")
        model = specs[0]
        plan, workload = plan_from_args(args, model)
    name = args.name if args.name != CalibrateConfig.name else TraceCalibrationConfig.name  # the trace fit's default
    config = TraceCalibrationConfig(traces=tuple(parse_list(args.trace, str, "--trace")),
                                    base=None if args.base == CalibrateConfig.base else args.base,
                                    system_out=args.system_out, name=name, model=model, workload=workload, plan=plan)
    outcome = run_calibrate_trace(config, args.out, analyse=write_trace_records)
    printer = Printer(args.format)
    printer.emit(outcome.fit.rows, title="fitted from the trace")
    if outcome.fit.categories:
        printer.emit(outcome.fit.categories, title="per step and category: the trace, the base system's and the "
                                                   "fitted system's prediction")
    for note in outcome.fit.notes:
        printer.note(f"note: {note}")
    printer.note(f"system: {outcome.system_out}  (use it with --system {outcome.system_out})")
    if outcome.path is not None:
        printer.note(f"records: {outcome.path}")
    return 0
