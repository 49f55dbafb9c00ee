"""`stepscope innet timeout-profile`: ok / to block counts per straggler timeout and workload (DPA's table),
and throughput per (STO, RTO), on the emulator. The work and the records:
`stepscope.innet.timeout_profile.run_profile`."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_seed_option,
    choice,
    non_negative_float,
    one_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
)
from stepscope.cli.options import innet as innet_options
from stepscope.distributed.collectives.sizes import format_bytes
from stepscope.innet.runs.timeout_profile import WORKLOADS, ProfileConfig

NAME = "timeout-profile"
HELP = "ok/to counts per straggler timeout, DPA's table"
DESCRIPTION = ("Sweep the straggler timeout over three workloads on the emulator and print ok / to block counts per "
               "cell, plus throughput per (STO, RTO).")


def add_options(parser: argparse.ArgumentParser) -> None:
    innet_options.add_world_option(parser, ProfileConfig)
    option = partial(add_config_option, parser, ProfileConfig)
    option(("-k", "--k"), "fastest-K (default world - 1)")
    option("--sto-ms", "straggler timeouts (ms)")
    option("--rto-ms", "worker retransmission timeouts (ms)")
    option("--sizes", "bytes per op (one size)", field="size_bytes", show=format_bytes)
    add_alias(parser, "--size", "--sizes")
    option("--ops", "ops of the waited and batch workloads")
    option("--workload", "workloads of the ok/to table", field="workloads")
    add_seed_option(parser, ProfileConfig, help="seed of the inputs")
    innet_options.add_job_options(parser, timers=False)
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.runs.timeout_profile import profile_table, run_profile, throughput_table

    config = ProfileConfig(world=innet_options.world(args), k=innet_options.optional_k(args.k),
                           sto_ms=tuple(unique(parse_list(args.sto_ms, non_negative_float, "--sto-ms"))),
                           rto_ms=tuple(unique(parse_list(args.rto_ms, positive_float, "--rto-ms"))),
                           size_bytes=one_value(args.sizes, innet_options.size_bytes, "--sizes"),
                           ops=one_value(args.ops, positive_int, "--ops"),
                           workloads=tuple(unique(parse_list(args.workload, choice(*WORKLOADS), "--workload"))),
                           seed=args.seed, job=innet_options.job_config(args, timers=False))
    outcome = run_profile(config, args.out, switch=args.switch)
    if outcome is None:  # not rank 0 under torchrun/Slurm: rank 0 reports
        return 0
    config, rows = outcome.config, outcome.rows
    printer = Printer(args.format)
    if args.format != "table":
        printer.emit(rows)
    else:
        straggler = config.job.faults.straggler
        printer.note(f"world {config.world}, straggle-{config.min_count}, {config.size_bytes} bytes per op, "
                     f"k {config.job.k} values/packet, slots {config.job.slots}"
                     + (f"; injected straggler: {straggler.describe()} (steps: ops of a cell)" if straggler else ""))
        printer.emit(profile_table(rows, config.ops), title=f"ok / to blocks (RTO {config.rto_ms[0]:g} ms)")
        printer.emit(throughput_table(rows), title=f"{config.ops} ops waited: GB/s")
    printer.note(f"records: {outcome.records}")
    return 0
