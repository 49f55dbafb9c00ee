"""`stepscope compare`: measured step records next to the model's prediction, error per phase."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_output_options
from stepscope.cli.predict import add_system_option
from stepscope.results.store import DEFAULT_OUT

COLUMNS = ["model", "n_layers", "batch", "seq", "precision", "forward_measured_ms", "forward_predicted_ms",
           "forward_error_pct", "backward_measured_ms", "backward_predicted_ms", "backward_error_pct",
           "optimizer_measured_ms", "optimizer_predicted_ms", "optimizer_error_pct", "step_error_pct"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("compare", help="measured step records next to predictions, error per phase",
                                   description="Predict every measured `step` record (same model, batch, sequence, "
                                               "precision, mode, attention) on a system and print the error per "
                                               "phase. Repeated measurements of one configuration are merged.")
    parser.add_argument("records", nargs="*", default=[DEFAULT_OUT],
                        help=f"record files or folders (default {DEFAULT_OUT})")
    add_system_option(parser, default="CPU")
    parser.add_argument("--where", action="append", default=[], metavar="FIELD=VALUES",
                        help="only records whose config FIELD (dotted) has one of VALUES; repeatable")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.perfmodel.compare import compare, summary
    from stepscope.perfmodel.records import load_records, parse_where
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.spec.system import load_system

    system = load_system(args.system)
    records = load_records(args.records, parse_where(args.where))
    if not records.steps:
        raise UsageError(f"no usable step records in {', '.join(map(str, args.records))}"
                         + (" matching the filters" if args.where else ""))
    for point in records.steps:
        system.accelerator.matrix_peak(point.workload.precision)
    store = RecordStore(args.out, "compare").check_writable()
    printer = Printer(args.format)
    comparisons = compare(records.steps, system)
    rows = [c.row() for c in comparisons]
    printer.emit(rows, title=f"measured vs predicted on {system.name}",
                 columns=[c for c in COLUMNS if any(c in r for r in rows)])
    printer.emit(summary(comparisons), title="absolute error per phase")
    env = base_environment()
    for comparison in comparisons:
        config, metrics = comparison.record()
        store.append(make_record("compare", config, metrics, env=env))
    if records.attention or records.comm:
        printer.note(f"note: {len(records.attention)} attention and {len(records.comm)} comm records are used by "
                     "calibrate only")
    printer.note(f"records: {store.path}")
    return 0
