"""`stepscope calibrate`: fit a system (efficiency curve, kernel overhead, bandwidth, links) to measured records."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_output_options, parse_list
from stepscope.results.store import DEFAULT_OUT


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("calibrate", help="fit a system TOML to measured step/attention/comm records",
                                   description="Fit the compute-efficiency curve, per-kernel overhead, streaming "
                                               "bandwidth and elementwise rate of a system to stepscope's own step "
                                               "records (least squares), plus flash efficiency from attention "
                                               "records and link α/β from comm records when present; write a "
                                               "system TOML that predict, plan and compare accept.")
    parser.add_argument("records", nargs="*", default=[DEFAULT_OUT],
                        help=f"record files or folders (default {DEFAULT_OUT})")
    parser.add_argument("--base", default="CPU", help="system preset or TOML the fit starts from (default CPU)")
    parser.add_argument("--where", action="append", default=[], metavar="FIELD=VALUES",
                        help="only records whose config FIELD (dotted, e.g. model_spec.n_layers) has one of VALUES; "
                             "repeatable")
    parser.add_argument("--system-out", default="calibrated.toml", help="where to write the fitted system TOML")
    parser.add_argument("--name", default="calibrated", help="name of the fitted system")
    parser.add_argument("--knots", default=None, help="efficiency-curve knots in GFLOP (comma list; default "
                                                      "0.001,0.01,0.1,1,10,100)")
    parser.add_argument("--prior-weight", default=None,
                        help="pull of the elementwise rate, bandwidth and kernel overhead toward --base, in units "
                             "of one phase's relative error (default 0.01; 0: none)")
    parser.add_argument("--max-efficiency", default=None,
                        help="cap of the efficiency curve, as a fraction of the measured large-GEMM rate (default 1; "
                             "at most 1.1, a margin for a peak measurement that ran slow)")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.perfmodel.calibrate import (
        DEFAULT_KNOTS_GFLOP,
        MAX_EFFICIENCY,
        PRIOR_WEIGHT,
        calibrate,
        check_max_efficiency,
    )
    from stepscope.perfmodel.compare import compare, summary
    from stepscope.perfmodel.records import load_records, parse_where
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.spec.system import load_system, system_to_toml

    base = load_system(args.base)
    where = parse_where(args.where)
    knots = tuple(parse_list(args.knots, float, "--knots")) if args.knots else DEFAULT_KNOTS_GFLOP
    if any(k <= 0 for k in knots) or list(knots) != sorted(set(knots)):
        raise UsageError(f"--knots must be positive and strictly increasing, got {args.knots}")
    prior_weight = PRIOR_WEIGHT if args.prior_weight is None else parse_list(args.prior_weight, float,
                                                                             "--prior-weight")[0]
    if not prior_weight >= 0:
        raise UsageError(f"--prior-weight must be >= 0, got {args.prior_weight}")
    max_efficiency = MAX_EFFICIENCY if args.max_efficiency is None else parse_list(args.max_efficiency, float,
                                                                                   "--max-efficiency")[0]
    check_max_efficiency(max_efficiency)  # before any folder is created
    target = Path(args.system_out)
    if target.is_dir():
        raise UsageError(f"cannot write the system to {target}: it is a folder")
    try:  # like --out, a missing folder is created (before the fit, so a bad path costs nothing)
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot write the system to {target}: {error.strerror or error}") from None
    records = load_records(args.records, where)
    store = RecordStore(args.out, "calibrate").check_writable()
    printer = Printer(args.format)

    result = calibrate(records, base, knots=knots, max_efficiency=max_efficiency, prior_weight=prior_weight,
                       name=args.name)
    header = (f"stepscope calibrate: {result.system.description}\n"
              f"records: {', '.join(str(r) for r in args.records)}"
              + (f"; filters: {' '.join(args.where)}" if args.where else ""))
    try:
        target.write_text(system_to_toml(result.system, header=header), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    printer.note(f"fitted {result.system.name} to {len(result.points)} configurations "
                 f"({result.iterations} active-set iterations)")
    printer.emit([{"parameter": k, "value": v, "source": result.sources[k]} for k, v in result.parameters.items()])
    fitted = compare(result.points, result.system)
    printer.emit(summary(fitted), title="fit error on the calibration records themselves (in-sample)")
    for note in result.notes:
        printer.note(f"note: {note}")
    if records.skipped:
        printer.note("skipped: " + "; ".join(f"{n} {reason}" for reason, n in records.skipped.items()))
    config = {"records": [str(r) for r in args.records], "where": args.where, "base": base.name,
              "knots_GFLOP": list(knots), "prior_weight": prior_weight, "max_efficiency": max_efficiency,
              "system_out": str(target)}
    metrics = {**result.parameters, "configurations": len(result.points), "parameter_sources": result.sources,
               **{f"{row['phase']}_median_abs_error_pct": row["median_abs_error_pct"] for row in summary(fitted)}}
    store.append(make_record("calibrate", config, metrics, env=base_environment()))
    printer.note(f"system: {target}  (use it with --system {target})")
    printer.note(f"records: {store.path}")
    return 0
