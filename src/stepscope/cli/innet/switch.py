"""`stepscope innet switch`: the software switch as a standalone process, until Ctrl-C (or --duration-s).
The work and the records: `stepscope.innet.switch.process.run_switch`."""

from __future__ import annotations

import argparse
from functools import partial

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    non_negative_int,
    one_value,
    optional_value,
    parse_list,
    positive_float,
    positive_int,
)
from stepscope.innet.switch.config import SwitchConfig

NAME = "switch"
HELP = "run the software aggregation switch (until Ctrl-C)"
DESCRIPTION = "A standalone switch process serving several jobs over UDP."


def add_options(parser: argparse.ArgumentParser) -> None:
    option = partial(add_config_option, parser, SwitchConfig)
    option("--host", "address to bind (0.0.0.0 for other machines)")
    option("--port", "UDP port (0: the OS picks; printed on start)")
    option("--max-jobs", "jobs served at once")
    option("--max-job-MiB", "memory one job may take (MiB)", field="max_job_bytes", show=lambda size: str(size >> 20))
    add_alias(parser, "--max-job-mib", "--max-job-MiB")
    option("--idle-s", "forget a job silent this long")
    option("--evict-after-s", "with the table full, a new job may evict a job that never completed a block and "
           "was silent this long")
    option("--shards", "switch processes, one port each (port, port+1, ...): slot j is served by shard j mod "
           "shards; workers are given every shard's address")
    parser.add_argument("--cpus", default=None, help="cores to pin shard i on (cpus[i mod n]), e.g. 0,1")
    parser.add_argument("--no-offload", action="store_true",
                        help="no UDP segmentation offload (GSO/GRO): one datagram per message")
    parser.add_argument("--duration-s", default=None, help="stop after this many seconds (default: Ctrl-C)")
    parser.add_argument("--stats-interval-s", default=None, help="print totals this often")
    parser.add_argument("--no-records", action="store_true", help="do not append records (a helper switch)")
    parser.add_argument("--stop-on-stdin-eof", action="store_true",
                        help="stop when stdin closes (a helper switch ends with the process that started it)")
    add_output_options(parser, resume=False)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.switch.process import run_switch
    from stepscope.innet.wire import protocol

    config = SwitchConfig(host=args.host, port=one_value(args.port, int, "--port"),
                          max_jobs=one_value(args.max_jobs, positive_int, "--max-jobs"),
                          max_job_bytes=one_value(args.max_job_MiB, positive_int, "--max-job-MiB") << 20,
                          idle_s=one_value(args.idle_s, positive_float, "--idle-s"),
                          evict_after_s=one_value(args.evict_after_s, positive_float, "--evict-after-s"),
                          shards=one_value(args.shards, positive_int, "--shards"), offload=not args.no_offload,
                          cpus=tuple(parse_list(args.cpus, non_negative_int, "--cpus")) if args.cpus else ())
    served = run_switch(config, None if args.no_records else args.out,
                        duration_s=optional_value(args.duration_s, positive_float, "--duration-s"),
                        stats_interval_s=optional_value(args.stats_interval_s, positive_float, "--stats-interval-s"),
                        stop_on_stdin_eof=args.stop_on_stdin_eof)
    printer = Printer(args.format)
    rows = served.job_rows()
    printer.emit(rows, title=f"innet switch: {len(rows)} job(s) served in {served.seconds:.1f} s",
                 columns=["job", *protocol.COUNTERS])
    printer.note("switch totals: " + ", ".join(f"{name} {value}" for name, value in served.counters.items()))
    return 130 if served.interrupted else 0
