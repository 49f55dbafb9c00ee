"""`stepscope ddp`: data-parallel variants side by side (ours and PyTorch's DDP), bucket-size sweep, memory
with and without optimizer-state sharding, analytic b*. The work, the records and the plot:
`stepscope.distributed.data_parallel.benchmark.run_ddp_sweep`, once per (model, batch, seq, threads) point."""

from __future__ import annotations

import argparse
import itertools
import sys
from functools import partial
from pathlib import Path
from typing import Any

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_plot_options,
    choice,
    non_negative_int,
    one_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
)
from stepscope.cli.options.distributed import add_launch_options
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.distributed.data_parallel.bench_config import ALL_VARIANTS, DDPBenchConfig
from stepscope.spec import PRECISIONS

NAME = "ddp"
HELP = "data-parallel variants vs PyTorch DDP: overlap, bucket sizes, sharded optimizer memory"
DESCRIPTION = ("Train on local ranks (or under torchrun) with every data-parallel variant interleaved in one run: "
               "step time, compute-only step, exposed communication and overlap, buckets, memory per rank with and "
               "without optimizer-state sharding, and the analytic bucket size b* = sqrt(s*w*alpha) from measured "
               "all-reduce costs. Comma lists sweep.")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, default="small")
    group = parser.add_argument_group("workload and variants")
    option = partial(add_config_option, group, DDPBenchConfig)
    option("--batch", "GLOBAL batch in sequences, split across ranks")
    option("--seq", "tokens per sequence")
    option("--world", "ranks to spawn (torchrun sets its own)")
    option("--precision", "|".join(PRECISIONS))
    option("--impl", "the variants to run; torch = torch.nn.parallel.DistributedDataParallel with the same caps",
           field="variants")
    add_alias(parser, "--variants", "--impl")
    option("--bucket-MiB", "bucket caps in MiB for bucketed and torch; 'none' = one bucket", show=_show_cap)
    add_alias(parser, "--bucket-mb", "--bucket-MiB")
    option("--bucket-rule", "strict|torch: how DDPBucketed fills buckets")
    group.add_argument("--shard-optimizer", action="store_true",
                       help="time steps with ShardedOptimizer(AdamW) (memory is shown for both)")
    timing = parser.add_argument_group("timing")
    option = partial(add_config_option, timing, DDPBenchConfig)
    option("--warmup", "untimed rounds after the correctness check")
    option("--iters", "timed rounds, every variant once per round")
    option("--comm-iters", "repetitions of communication-only timings")
    timing.add_argument("--threads", default=None, help="intra-op threads per rank (comma list sweeps; "
                        "default cores / ranks)")
    option("--seed", "seed for weights (+rank) and data")
    add_launch_options(timing, DDPBenchConfig, backends="auto|gloo|nccl")
    add_plot_options(parser, "ddp.png")
    add_output_options(parser)


def _cap(text: str) -> float | None:
    if text.lower() in ("none", "one"):
        return None
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def _show_cap(cap: float | None) -> str:
    return "none" if cap is None else f"{cap:g}"


def build_configs(args: argparse.Namespace) -> list[DDPBenchConfig]:
    """Every benchmark point of the command line (checked by the sweep before any rank starts)."""
    from stepscope.distributed.launch.ranks import effective_world

    common: dict[str, Any] = dict(
        world=effective_world(one_value(args.world, positive_int, "--world")),
        precision=one_value(args.precision, choice(*PRECISIONS), "--precision"),
        variants=tuple(dict.fromkeys(parse_list(args.impl, choice(*ALL_VARIANTS), "--impl"))),
        bucket_MiB=tuple(dict.fromkeys(parse_list(args.bucket_MiB, _cap, "--bucket-MiB"))),
        bucket_rule=one_value(args.bucket_rule, choice("strict", "torch"), "--bucket-rule"),
        shard_optimizer=args.shard_optimizer,
        warmup=one_value(args.warmup, non_negative_int, "--warmup"),
        iters=one_value(args.iters, positive_int, "--iters"),
        comm_iters=one_value(args.comm_iters, positive_int, "--comm-iters"),
        backend=one_value(args.backend, choice("auto", "gloo", "nccl"), "--backend"),
        seed=one_value(args.seed, non_negative_int, "--seed"),
        timeout_s=one_value(args.timeout_s, positive_float, "--timeout-s"), oversubscribe=args.oversubscribe)
    batches = unique(parse_list(args.batch, positive_int, "--batch"))
    seqs = unique(parse_list(args.seq, positive_int, "--seq"))
    threads = [None] if args.threads is None else unique(parse_list(args.threads, positive_int, "--threads"))
    return [DDPBenchConfig(model=spec, batch=batch, seq=seq, threads=thread, **common)
            for spec, batch, seq, thread in itertools.product(model_specs(args), batches, seqs, threads)]


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.distributed.data_parallel.benchmark import run_ddp_sweep

    configs = build_configs(args)
    printer = Printer(args.format)
    plot = None if args.no_plot else (args.plot or Path(args.out) / "ddp.png")
    outcome = run_ddp_sweep(configs, args.out, resume=args.resume, plot=plot,
                            on_result=lambda config, result: _show(printer, args.format, config, result),
                            on_oom=lambda oom: printer.note(f"oom: global batch {oom.config.batch} seq "
                                                            f"{oom.config.seq}: {oom.note}"))
    if not outcome.reporting:
        return 0
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/ddp.jsonl (--resume)")
    if outcome.plot is not None:
        printer.note(f"plot: {outcome.plot}")
    printer.note(f"records: {args.out}/ddp.jsonl")
    if outcome.wrong:  # like `stepscope comm`: timings of a variant that computes wrong gradients are no success
        print(f"stepscope: averaged gradients differ from the reference for {', '.join(outcome.wrong)} (see check)",
              file=sys.stderr)
        return 1
    return 0


def _show(printer: Any, fmt: str, config: DDPBenchConfig, result: Any) -> None:
    from stepscope.distributed.data_parallel.bench_result import model_label

    title = (f"{model_label(config.model)} global batch {config.batch} seq {config.seq} {config.precision}, "
             f"{result.world_size} ranks x {result.threads} thread(s), {result.backend} on {result.device}"
             f"{', ShardedOptimizer(AdamW)' if config.shard_optimizer else ', AdamW'}")
    rows = result.rows()
    if fmt in ("table", "md"):
        printer.emit(rows, title=title + " (ms: slowest rank per round; vs_torch: ratio of the step medians)")
        printer.emit(result.memory_rows(), title="memory per rank over a first step of the bare model (rank 0; "
                                                 "each variant's gradient memory once synchronized, buckets "
                                                 "included, is its grads_MiB above)")
    else:
        point = {"model": model_label(config.model), "batch": config.batch, "seq": config.seq,
                 "precision": config.precision, "world": result.world_size, "threads": result.threads}
        printer.emit([{**point, **row} for row in rows])
    for line in result.summary_lines():
        printer.note(line)
