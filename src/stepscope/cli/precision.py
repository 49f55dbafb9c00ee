"""`stepscope precision accumulate|dtypes`: the two classic mixed-precision experiments."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_model_options, add_output_options


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
    from stepscope.measure.precision import accumulate
    from stepscope.results.store import RecordStore, make_record

    store = RecordStore(args.out, "precision").check_writable()
    rows = accumulate(args.steps, args.increment)
    env = torch_environment("cpu")
    for row in rows:
        store.append(make_record("precision", {"experiment": "accumulate", "case": row["case"],
                                               "steps": args.steps, "increment": args.increment},
                                 {k: row[k] for k in ("value", "abs_error", "rel_error")}, env=env))
    Printer(args.format).emit(rows, title=f"sum of {args.increment} x {args.steps} (exact "
                                          f"{args.increment * args.steps:g})")
    return 0


def run_dtypes(args: argparse.Namespace) -> int:
    import torch

    from stepscope.cli.options import model_specs
    from stepscope.cli.output import Printer
    from stepscope.measure.device import check_precision, resolve_device
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.precision import ToyModel, autocast_dtypes
    from stepscope.results.store import RecordStore, make_record

    device = resolve_device(args.device)
    check_precision(device, args.precision)
    torch.manual_seed(0)
    if args.model == "toy":
        model = ToyModel().to(device)
        inputs = torch.randn(8, 16, device=device)
        loss_fn = lambda out: out.float().pow(2).mean()  # noqa: E731
        name = "toy"
    else:
        from stepscope.nn import TransformerLM, lm_loss

        specs = model_specs(args)
        if len(specs) != 1:
            from stepscope.errors import UsageError

            raise UsageError("precision dtypes takes one model (no comma lists)")
        spec = specs[0]
        model = TransformerLM(spec).to(device)
        data = torch.randint(0, spec.vocab_size, (2, min(17, spec.context_length + 1)), device=device)
        inputs, targets = data[:, :-1], data[:, 1:]
        loss_fn = lambda logits: lm_loss(logits, targets)  # noqa: E731
        name = spec.name
    store = RecordStore(args.out, "precision").check_writable()
    rows, loss_dtype = autocast_dtypes(model, inputs, loss_fn, device, args.precision)
    store.append(make_record("precision", {"experiment": "dtypes", "model": name, "precision": args.precision,
                                           "device": device.type},
                             {"modules": rows, "loss_dtype": loss_dtype}, env=torch_environment(device)))
    printer = Printer(args.format)
    printer.emit(rows, title=f"{name} under {args.precision} autocast on {device.type}")
    printer.note(f"loss dtype: {loss_dtype}")
    return 0
