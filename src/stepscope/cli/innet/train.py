"""`stepscope innet train`: DDP training whose gradient buckets are averaged by the switch, gloo beside it,
with and without fastest-K and an injected straggler. The work and the records:
`stepscope.innet.train.run_train`."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_seed_option,
    choice,
    field_default,
    one_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
)
from stepscope.cli.options import innet as innet_options
from stepscope.cli.options.model import add_model_options
from stepscope.errors import UsageError
from stepscope.innet.runs.train import DDP_KINDS, TrainConfig

CPU_LAYERS = 1
"""Layers of the model unless --n-layers is given: a real model's buckets, at a step time a CPU can afford."""

NAME = "train"
HELP = "DDP training with gradient buckets averaged by the switch"
DESCRIPTION = ("Train with DDP: gloo baseline, then the innet hook for K = world and K < world, each without and "
               "with an injected straggler. On CPU the model is shortened "
               f"({CPU_LAYERS} layer unless --n-layers is given).")


COLUMNS = ["backend", "tolerance", "straggler", "step_ms_median", "fast_ranks_step_ms_median",
           "straggler_step_ms_median", "timed_out_blocks", "min_contributors", "loss"]


def add_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, default=field_default(TrainConfig, "model").name)
    innet_options.add_world_option(parser, TrainConfig)
    option = partial(add_config_option, parser, TrainConfig)
    option("--batch", "sequences per rank and step")
    option("--seq", "tokens per sequence")
    option("--steps", "timed steps per scenario")
    option("--warmup", "untimed steps per scenario")
    option(("-k", "--k"), "fastest-K values: numbers, world, world-1 ... (default world,world-1)", field="ks")
    option("--ddp", "torch (DistributedDataParallel) or bucketed (DDPBucketed)")
    option("--bucket-MiB", "gradient bucket cap (MiB)")
    add_alias(parser, "--bucket-mb", "--bucket-MiB")
    parser.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    option("--lr", "SGD learning rate")
    add_seed_option(parser, TrainConfig, help="seed of weights and data")
    innet_options.add_job_options(parser)
    # this command's job: its own packet size; its straggler (default: the last rank, 2 s) is TrainConfig's
    parser.set_defaults(values_per_packet=str(field_default(TrainConfig, "job").values_per_packet))
    add_output_options(parser, resume=False)


def train_config(args: argparse.Namespace) -> TrainConfig:
    from stepscope.cli.options.model import model_specs
    from stepscope.innet.worker.faults import StragglerSpec

    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError("innet train takes one model (no sweeps)")
    spec = specs[0] if args.override_n_layers is not None else specs[0].replace(n_layers=CPU_LAYERS)
    straggler = {} if args.straggler is None else {"straggler": StragglerSpec.parse(args.straggler)}
    world = innet_options.world(args)

    def k_value(text: str) -> int:  # 3, world or world-1 (as the default is written)
        if text != "world" and not text.startswith("world-"):
            return positive_int(text)
        k = world - (positive_int(text[len("world-"):]) if text != "world" else 0)
        if k < 1:
            raise UsageError(f"-k {text} is {k} at world {world}: fastest-K needs at least 1 rank")
        return k

    return TrainConfig(model=spec, world=world,
                       batch=one_value(args.batch, positive_int, "--batch"),
                       seq=one_value(args.seq, positive_int, "--seq"),
                       steps=one_value(args.steps, positive_int, "--steps"),
                       warmup=one_value(args.warmup, positive_int, "--warmup"),
                       ks=None if args.k is None else tuple(unique(parse_list(args.k, k_value, "-k"))),
                       gloo=not args.no_gloo, ddp=one_value(args.ddp, choice(*DDP_KINDS), "--ddp"),
                       bucket_MiB=one_value(args.bucket_MiB, positive_float, "--bucket-MiB"),
                       lr=one_value(args.lr, positive_float, "--lr"), seed=args.seed,
                       job=innet_options.job_config(args, straggler=False), **straggler)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.runs.train import run_train

    outcome = run_train(train_config(args), args.out, switch=args.switch)
    if outcome is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    config = outcome.config
    printer = Printer(args.format)
    printer.note(f"{config.model.describe()} | world {config.world}, batch {config.batch} x seq {config.seq}, "
                 f"{config.ddp} DDP, buckets {outcome.buckets} values")
    for lines in outcome.log:
        for line in lines:
            printer.note(line)
    printer.emit(outcome.rows, title=f"innet train: per-step time, {config.steps} steps per scenario "
                 f"(k {config.job.k} values/packet, STO {config.job.resolved_sto_ticks} ticks)",
                 columns=[c for c in COLUMNS if any(c in r for r in outcome.rows)])
    printer.note("replicas identical after training: " + ", ".join(
        f"{backend} {'yes' if same else 'NO'}" for backend, same in outcome.replicas_identical.items()))
    printer.note(f"records: {outcome.records}")
    return 0
