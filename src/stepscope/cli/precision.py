"""`stepscope precision accumulate|dtypes`: the two classic mixed-precision experiments."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_output_options
from stepscope.cli.options.model import add_model_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("precision", help="mixed-precision experiments (accumulate, dtypes)",
                                   description="Mixed-precision experiments.")
    commands = parser.add_subparsers(dest="precision_command", metavar="EXPERIMENT", required=True,
                                     parser_class=type(parser))
    acc = commands.add_parser("accumulate", help="add 0.01 a thousand times in several dtypes")
    acc.add_argument("--steps", type=int, default=1000)
    acc.add_argument("--increment", type=float, default=0.01)
    add_output_options(acc, resume=False)
    acc.set_defaults(func=run_accumulate)

    dtypes = commands.add_parser("dtypes", help="dtypes of parameters, outputs and gradients under autocast")
    add_model_options(dtypes, default="toy")
    dtypes.add_argument("--precision", default="bf16", choices=["bf16", "fp16"],
                        help="autocast dtype (default bf16)")
    dtypes.add_argument("--device", default="auto")
    add_output_options(dtypes, resume=False)
    dtypes.set_defaults(func=run_dtypes)


def run_accumulate(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.precision.experiments import accumulate
    from stepscope.results.store import RecordStore, make_record

    rows = accumulate(args.steps, args.increment)  # microseconds of work; validates the arguments first
    store = RecordStore(args.out, "precision").check_writable()
    env = torch_environment("cpu")
    for row in rows:
        store.append(make_record("precision", {"experiment": "accumulate", "case": row["case"],
                                               "steps": args.steps, "increment": args.increment},
                                 {k: row[k] for k in ("value", "abs_error", "rel_error")}, env=env))
    Printer(args.format).emit(rows, title=f"sum of {args.increment} x {args.steps} (exact "
                                          f"{args.increment * args.steps:g})")
    return 0


def run_dtypes(args: argparse.Namespace) -> int:
    from stepscope.cli.options.model import model_specs
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.device import check_precision, resolve_device
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.precision.experiments import model_dtypes
    from stepscope.results.store import RecordStore, make_record

    device = resolve_device(args.device)
    check_precision(device, args.precision)
    config = {"experiment": "dtypes", "model": args.model, "precision": args.precision, "device": device.type}
    if args.model == "toy":
        if any(getattr(args, name) is not None for name in vars(args) if name.startswith("override_")):
            raise UsageError("the toy model takes no field overrides (use a preset, e.g. --model tiny)")
        spec = None
    else:
        specs = model_specs(args)
        if len(specs) != 1:
            raise UsageError("precision dtypes takes one model (no comma lists)")
        spec = specs[0]
        config["model_spec"] = spec.to_dict()
    store = RecordStore(args.out, "precision").check_writable()
    rows, loss_dtype = model_dtypes(spec, device, args.precision)
    store.append(make_record("precision", config, {"modules": rows, "loss_dtype": loss_dtype},
                             env=torch_environment(device)))
    printer = Printer(args.format)
    printer.emit(rows, title=f"{args.model} under {args.precision} autocast on {device.type}")
    printer.note(f"loss dtype: {loss_dtype}")
    return 0
