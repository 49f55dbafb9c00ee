"""`stepscope innet simulate`: the protocol modelled at line rate (no sockets); comma lists sweep.
The work and the records: `stepscope.innet.sim.sweep.run_simulate`."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_seed_option,
    fraction,
    one_value,
    optional_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
)
from stepscope.cli.options.innet import size_bytes
from stepscope.distributed.collectives.sizes import format_bytes
from stepscope.innet.sim.config import EMULATOR_SWITCH_MPPS, EMULATOR_WORKER_MPPS, SimConfig

NAME = "simulate"
HELP = "discrete-event model of the protocol at line rate"
DESCRIPTION = ("Simulate the protocol at line rate (no sockets): counters, throughput, ideal in-network and ring "
               "bounds. Comma lists sweep.")


SWEEPS: dict[str, Callable[[str], Any]] = {  # SimConfig field (its option: --field-name or OPTIONS) -> converter
    "workers": positive_int, "link_Gbps": positive_float, "pipes": positive_int, "slots": positive_int,
    "sto_ms": float, "rto_ms": positive_float, "workload": str, "loss": fraction, "op_bytes": size_bytes,
    "k": lambda text: None if text == "world" else positive_int(text),
}
OPTIONS = {"workers": "world"}
"""A swept field whose option is named otherwise (as `innet bench` names the ranks)."""
COLUMNS = ["workers", "link_Gbps", "pipes", "slots", "workload", "sto_ms", "sto_ticks", "rto_ms", "k", "loss",
           "op_bytes", "ok", "to", "kr", "re", "dup", "old", "op_ms_mean", "algbw_GBps", "ideal_innet_algbw_GBps",
           "ideal_ring_algbw_GBps", "sim_packets", "sim_packets_per_s"]


def add_options(parser: argparse.ArgumentParser) -> None:
    option = partial(add_config_option, parser, SimConfig)
    option("--world", "workers n (ranks), 2-1024", field="workers")
    add_alias(parser, "--workers", "--world")
    option("--link-Gbps", "link line rate B, 10-400 gigabits per second")
    add_alias(parser, "--link-gbps", "--link-Gbps")
    option("--pipes", "switch pipelines 1-4 (k = 64 x pipes)")
    option("--slots", "slot pool size s")
    option("--window", "outstanding packets per worker (default slots)")
    option("--op-bytes", "bytes per all-reduce (K, M, G suffixes)", show=format_bytes)
    option("--workload", "one | waited | batch (ops each waited or issued together)")
    option("--ops", "ops of the waited and batch workloads")
    option("--sto-ms", "straggler timeout (ms, rounded up to ticks)")
    option(("-k", "--k"), "fastest-K", none="world")
    parser.add_argument("--preemptive", action="store_true", help="complete at K without the timer")
    option("--rto-ms", "worker retransmission timeout (ms)")
    option("--rtt-us", "base round-trip time (us)")
    option("--jitter-us", "mean exponential one-way jitter (us)")
    option("--loss", "loss probability per packet and direction")
    option("--stall-prob", "chance a host stalls before a packet")
    option("--stall-us", "mean (exponential) host stall (us)")
    parser.add_argument("--straggler", default=None, metavar="SPEC",
                        help="e.g. 'ranks=5;delay=2s;prob=1;steps=3-5' (delay before each op, or ops 3-5 "
                        "(0-based); add dist=exp for exponential)")
    parser.add_argument("--int32", action="store_true", help="int32 ops (no exponent prologue round)")
    parser.add_argument("--switch-Mpps", default=None, help="packets (in + out) per second, in millions, the switch "
                        "handles (default: line rate; `emulator`: the software switch as measured here)")
    add_alias(parser, "--switch-mpps", "--switch-Mpps")
    parser.add_argument("--worker-Mpps", default=None, help="packets per second, in millions, a worker's host "
                        "handles (default: line rate; `emulator`: the emulator's worker as measured here)")
    add_alias(parser, "--worker-mpps", "--worker-Mpps")
    add_seed_option(parser, SimConfig, help="random seed")
    add_output_options(parser, resume=False)


def sim_configs(args: argparse.Namespace) -> list[SimConfig]:
    """Every point of the command line (a SimConfig per combination of the swept values)."""
    from stepscope.innet.sim.sweep import straggler_settings

    fixed = dict(window=optional_value(args.window, positive_int, "--window"),
                 ops=one_value(args.ops, positive_int, "--ops"), preemptive=args.preemptive,
                 rtt_us=one_value(args.rtt_us, float, "--rtt-us"),
                 jitter_us=one_value(args.jitter_us, float, "--jitter-us"),
                 stall_prob=one_value(args.stall_prob, float, "--stall-prob"),
                 stall_us=one_value(args.stall_us, float, "--stall-us"), quantized=not args.int32, seed=args.seed,
                 switch_Mpps=_rate(args.switch_Mpps, EMULATOR_SWITCH_MPPS, "--switch-Mpps"),
                 worker_Mpps=_rate(args.worker_Mpps, EMULATOR_WORKER_MPPS, "--worker-Mpps"),
                 **(straggler_settings(args.straggler) if args.straggler else {}))
    swept = {name: unique(parse_list(getattr(args, OPTIONS.get(name, name)), convert,
                                     f"--{OPTIONS.get(name, name).replace('_', '-')}"))
             for name, convert in SWEEPS.items()}
    return [SimConfig(**fixed, **dict(zip(swept, values, strict=True)))
            for values in itertools.product(*swept.values())]


def _rate(text: str | None, emulator: float, option: str) -> float | None:
    return emulator if text == "emulator" else optional_value(text, positive_float, option)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.innet.runs.timeout_profile import profile_table, throughput_table
    from stepscope.innet.sim.sweep import run_simulate

    configs = sim_configs(args)
    outcome = run_simulate(configs, args.out)
    rows = outcome.rows
    printer = Printer(args.format)
    columns = [c for c in COLUMNS if c in rows[0]]
    first_metric = columns.index("ok")  # settings before, results from here on
    varying = [c for c in columns[:first_metric] if len({str(r[c]) for r in rows}) > 1]
    shown = varying + columns[first_metric:] if len(rows) > 1 else columns
    printer.emit(rows, title=f"innet simulate: {len(rows)} point(s)", columns=shown)
    # DPA's summary tables key a cell by STO, workload and RTO only: with any other setting swept they would
    # keep one of its points and drop the rest, so they are printed only when nothing else varies
    summarizable = set(varying) <= {"sto_ms", "sto_ticks", "workload", "rto_ms"}
    if args.format == "table" and len({r["sto_ms"] for r in rows}) > 1 and summarizable:
        printer.emit(profile_table(rows, configs[0].ops), title="ok / to blocks (DPA's layout)")
        workload = "waited" if any(r["workload"] == "waited" for r in rows) else rows[0]["workload"]
        printer.emit(throughput_table(rows, workload=workload), title=f"{workload}: GB/s")
    printer.note(f"simulated {outcome.packets:,} packets at {outcome.packets_per_s:,.0f} packets/s; "
                 f"records: {outcome.path}")
    return 0

