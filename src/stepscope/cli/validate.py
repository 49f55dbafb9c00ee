"""`stepscope validate`: predict the published measured runs shipped with stepscope, print the errors."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_output_options, choice
from stepscope.cli.predict import add_system_option


def register(subparsers: argparse._SubParsersAction) -> None:
    from stepscope.perfmodel.validate import DATASETS

    parser = subparsers.add_parser("validate", help="predict published measured runs and print the error",
                                   description="Predict every published run shipped with stepscope (Narayanan et "
                                               "al. 2021, Table 1: Megatron-LM GPT 1.7B-1T on up to 3072 A100s) "
                                               "from first principles and print predicted vs measured.")
    add_system_option(parser)
    parser.add_argument("--dataset", default=DATASETS[0], help=f"one of {', '.join(DATASETS)}")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.validate import DATASETS, median_abs_error, validate
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.spec.system import load_system

    dataset = choice(*DATASETS)(args.dataset)
    system = load_system(args.system)
    store = RecordStore(args.out, "validate").check_writable()
    printer = Printer(args.format)
    rows = validate(system, dataset)
    printer.emit([r.row() for r in rows], title=f"{dataset} on {system.name}: predicted vs measured step time")
    printer.note(f"median absolute error: {100 * median_abs_error(rows):.1f}% over {len(rows)} runs "
                 f"(largest {100 * max(abs(r.error) for r in rows):.1f}%)")
    env = base_environment()
    for r in rows:
        config = {"dataset": dataset, "run": r.run.label, "system": system.name, "model_spec": r.run.model.to_dict(),
                  **r.run.workload.to_dict(), "plan": r.run.plan.to_dict()}
        metrics = {k: v for k, v in r.row().items() if k not in ("run", "plan")}
        store.append(make_record("validate", config, metrics, env=env))
    printer.note(f"records: {store.path}")
    return 0
