"""`stepscope moe`: one Mixture-of-Experts layer expert-parallel over spawned ranks; dispatch and combine
all-to-all against expert compute. The work and the record: `stepscope.distributed.expert_parallel.benchmark`
(`run_moe_ep`)."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_config_option,
    add_output_options,
    add_seed_option,
    non_negative_int,
    one_value,
    optional_value,
    positive_float,
    positive_int,
)
from stepscope.cli.options.distributed import add_launch_options
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.distributed.expert_parallel.config import EPConfig

NAME = "moe"
HELP = "time an expert-parallel MoE layer: dispatch/combine all-to-all vs expert compute"
DESCRIPTION = ("Run one MoE layer of a preset with its routed experts spread over --ep spawned ranks: tokens are "
               "dispatched to their experts' ranks and combined back with uneven all_to_all_single; the output is "
               "checked against the single-process layer, then router, dispatch, experts, combine and shared "
               "experts are timed (slowest rank per call).")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, default="tiny-moe")
    group = parser.add_argument_group("expert parallelism")
    option = partial(add_config_option, group, EPConfig)
    option("--ep", "expert-parallel ranks (each owns n_experts / ep experts)")
    option("--tokens", "tokens per rank per call")
    option("--warmup", "untimed calls")
    option("--iters", "timed calls")
    group.add_argument("--threads", default=None, help="CPU threads per rank (default: cores / ranks)")
    add_seed_option(group, EPConfig)
    add_launch_options(group, EPConfig, backends="gloo|nccl")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.distributed.expert_parallel.benchmark import run_moe_ep
    from stepscope.errors import UsageError

    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError(f"moe runs one model, --model and the field overrides make {len(specs)}")
    config = EPConfig(model=specs[0], ep=one_value(args.ep, positive_int, "--ep"),
                      tokens=one_value(args.tokens, positive_int, "--tokens"),
                      warmup=one_value(args.warmup, non_negative_int, "--warmup"),
                      iters=one_value(args.iters, positive_int, "--iters"), backend=args.backend,
                      timeout_s=one_value(args.timeout_s, positive_float, "--timeout-s"),
                      threads=optional_value(args.threads, positive_int, "--threads"), seed=args.seed)
    printer = Printer(args.format)
    record, result = run_moe_ep(config, args.out)
    table = result.table()
    printer.emit(table.rows, title=table.title)
    printer.note(f"{result.check_line()}; load: busiest expert {result.load_max_over_mean:.3f}x the mean; "
                 f"dispatch+combine {record['metrics']['comm_pct']:.1f}% of the layer")
    printer.note(f"records: {args.out}/moe-ep.jsonl")
    return 0 if result.matches else 1
