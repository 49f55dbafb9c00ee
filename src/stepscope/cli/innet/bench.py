"""`stepscope innet bench`: in-network all-reduce vs gloo, latency and algbw per size, per-op and batch.
The work and the records: `stepscope.innet.bench.run_bench`."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_seed_option,
    choice,
    non_negative_int,
    one_value,
    parse_list,
    positive_int,
    unique,
)
from stepscope.cli.options import innet as innet_options
from stepscope.distributed.collectives.points import CALL_MODES
from stepscope.distributed.collectives.sizes import format_bytes
from stepscope.innet.runs.bench import BenchConfig

NAME = "bench"
HELP = "innet all-reduce vs gloo: latency and algbw vs size"
DESCRIPTION = ("In-network all-reduce through a switch process, per-op and batch, side by side with gloo all-reduce "
               "at the same world size.")


COLUMNS = ["size_bytes", "mode", "innet_latency_ms_median", "innet_algbw_GBps", "gloo_latency_ms_median",
           "gloo_algbw_GBps", "innet_vs_gloo_speedup", "ok", "to", "kr", "re", "dup", "old", "bad",
           "worker_retransmissions", "checked_elements", "wrong_elements", "unchecked_elements"]


def add_options(parser: argparse.ArgumentParser) -> None:
    innet_options.add_world_option(parser, BenchConfig)
    option = partial(add_config_option, parser, BenchConfig)
    option("--sizes", "all-reduce sizes in bytes (K, M suffixes)", field="sizes_bytes", show=format_bytes)
    option("--call-mode", "per-op (each op waited), batch (issued together) or both", field="modes")
    add_alias(parser, "--mode", "--call-mode")
    option("--batch", "ops issued together in batch mode")
    option("--warmup", "untimed iterations per cell")
    option("--iters", "timed iterations per cell")
    option("--dtype", "fp32 (quantized) or int32 (exact sum); f32, i32 as before")
    option("--op", "avg or sum")
    option(("-k", "--k"), "fastest-K (default: world, no tolerance)")
    parser.add_argument("--preemptive", action="store_true", help="complete blocks at K without the timeout")
    parser.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    option("--switch-shards", "processes of the switch started for the run (slot j on shard j mod shards)")
    parser.add_argument("--check", action="store_true", help="verify every result; count wrong elements")
    parser.add_argument("--tally", nargs="?", const="syscalls", choices=("syscalls",), default=None,
                        help="syscalls (the default of a bare --tally): run the benchmark again "
                        "under strace and tally what innet (workers and switch) and gloo do beneath their APIs: "
                        "system calls by kind, processes, threads, per size side by side, with the overhead")
    add_seed_option(parser, BenchConfig, help="seed of inputs and straggler decisions")
    innet_options.add_job_options(parser)
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.runs.bench import run_bench

    config = BenchConfig(world=innet_options.world(args),
                         sizes_bytes=tuple(unique(parse_list(args.sizes, innet_options.size_bytes, "--sizes"))),
                         modes=tuple(unique(parse_list(args.call_mode, choice(*CALL_MODES), "--call-mode"))),
                         batch=one_value(args.batch, positive_int, "--batch"),
                         warmup=one_value(args.warmup, non_negative_int, "--warmup"),
                         iters=one_value(args.iters, positive_int, "--iters"),
                         dtype=one_value(args.dtype, innet_options.element_dtype, "--dtype"), op=args.op,
                         k=innet_options.optional_k(args.k),
                         preemptive=args.preemptive, gloo=not args.no_gloo, check=args.check, seed=args.seed,
                         switch_shards=one_value(args.switch_shards, positive_int, "--switch-shards"),
                         job=innet_options.job_config(args), syscalls=args.tally == "syscalls")
    outcome = run_bench(config, args.out, switch=args.switch)
    if outcome is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    config, rows = outcome.config, outcome.rows
    k = config.k or config.world
    title = (f"innet bench: world {config.world}, k {config.job.k} values/packet ({config.job.pipes}-pipe), "
             f"slots {config.job.slots}, {config.dtype} {config.op}, "
             f"{'no-straggle' if k >= config.world else f'straggle-{k}'}, STO {config.job.resolved_sto_ticks} ticks, "
             f"{outcome.data_paths}")
    printer = Printer(args.format)
    printer.emit(rows, title=title, columns=[c for c in COLUMNS if any(c in r for r in rows)])
    if outcome.syscalls:
        from stepscope.cli.comm import print_syscalls

        print_syscalls(args.format, printer, outcome.syscalls)
    printer.note(f"records: {outcome.records}")
    if outcome.wrong_elements:  # like `stepscope comm`: a benchmark whose results are wrong does not succeed
        print(f"stepscope: {outcome.wrong_elements} element(s) of in-network results were wrong (see wrong_elements)",
              file=sys.stderr)
        return 1
    return 0
