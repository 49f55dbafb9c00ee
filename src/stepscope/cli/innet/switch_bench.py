"""`stepscope innet switch-bench`: the switch alone, driven by a packet generator at a given packet size and rate:
packets per second in and out, GB/s, per core. The work and the records: `stepscope.innet.runs.switch_bench`."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_config_option,
    add_output_options,
    non_negative_float,
    one_value,
    optional_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
    yes_no,
)
from stepscope.cli.options.innet import size_bytes
from stepscope.distributed.collectives.sizes import format_bytes
from stepscope.innet.runs.switch_bench import SwitchBenchConfig

NAME = "switch-bench"
HELP = "the switch alone under a packet generator: packets/s and GB/s it sustains"
DESCRIPTION = ("A switch process (its own cores) driven by a packet generator (the other cores) at a given packet "
               "size and rate, without workers: packets/s in and out, GB/s, CPU per packet. Comma lists sweep.")

COLUMNS = ["payload_bytes", "world", "shards", "offload", "rate_pps", "in_pps", "out_pps", "total_pps", "total_GBps",
           "switch_cores", "total_pps_per_core", "total_pps_repeats", "wrong", "stalled"]


def add_options(parser: argparse.ArgumentParser) -> None:
    option = partial(add_config_option, parser, SwitchBenchConfig)
    option("--payload", "bytes of values per packet (K suffix; 1K = 256 values)", field="payload_bytes",
           show=format_bytes)
    option("--world", "ranks the generator plays")
    option("--rate", "offered input packets/s, all ranks (0: as fast as the switch answers)", field="rates_pps")
    option("--shards", "switch processes, one core each")
    option("--offload", "UDP segmentation offload (GSO/GRO): yes, no or both (yes,no)")
    option("--slots", "slots of the generator's job")
    option("--window", "packets in flight per generator rank (default: 1 MiB of them, at most slots)")
    option("--duration-s", "measured seconds per point and repeat")
    option("--warmup-s", "unmeasured seconds before each measurement")
    option("--repeats", "interleaved repeats per point (medians are recorded)")
    parser.add_argument("--switch", default=None, metavar="HOST:PORT",
                        help="drive this running switch (shards: HOST:PORT,HOST:PORT) instead of starting one")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.runs.switch_bench import run_switch_bench

    config = SwitchBenchConfig(
        payload_bytes=tuple(unique(parse_list(args.payload, size_bytes, "--payload"))),
        world=tuple(unique(parse_list(args.world, positive_int, "--world"))),
        rates_pps=tuple(unique(parse_list(args.rate, non_negative_float, "--rate"))),
        shards=tuple(unique(parse_list(args.shards, positive_int, "--shards"))),
        offload=tuple(unique(parse_list(args.offload, lambda text: yes_no(text, "--offload"), "--offload"))),
        slots=one_value(args.slots, positive_int, "--slots"),
        window=optional_value(args.window, positive_int, "--window"),
        duration_s=one_value(args.duration_s, positive_float, "--duration-s"),
        warmup_s=one_value(args.warmup_s, non_negative_float, "--warmup-s"),
        repeats=one_value(args.repeats, positive_int, "--repeats"))
    outcome = run_switch_bench(config, args.out, switch=args.switch)
    printer = Printer(args.format)
    printer.emit(outcome.rows, title=f"innet switch-bench: medians of {config.repeats} interleaved repeat(s) of "
                 f"{config.duration_s:g} s, {outcome.data_paths}", columns=COLUMNS)
    printer.note(f"records: {outcome.records}")
    return 0
