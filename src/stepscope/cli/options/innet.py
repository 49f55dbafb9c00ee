"""Options the innet commands share: the switch job (switch, packets, timers), fault injection, `-k`, `--world`,
byte sizes; their defaults come from `JobConfig` and `FaultConfig`. Parsing only: the checks against each other
and the world are the library's (`stepscope.innet`)."""

from __future__ import annotations

import argparse

from stepscope.cli.options import (
    add_config_option,
    choice,
    config_default,
    field_default,
    fraction,
    non_negative_int,
    one_value,
    optional_value,
    positive_float,
    positive_int,
    probability,
)
from stepscope.distributed.collectives.sizes import parse_size
from stepscope.innet.worker.config import JobConfig
from stepscope.innet.worker.faults import FaultConfig, StragglerSpec


def size_bytes(text: str) -> int:
    """'4096', '64K', '1M', '1.5MiB' -> bytes (K, M, G are powers of 1024, as in `stepscope comm --sizes`)."""
    value = parse_size(text)
    if value <= 0:
        raise ValueError(text)
    return value


DTYPE_ALIASES = {"f32": "fp32", "i32": "int32"}
"""The element types innet carries, by their earlier names: one spelling everywhere (fp32 as in `comm --dtype`)."""


def element_dtype(text: str) -> str:
    """fp32 or int32 (f32 and i32 as before)."""
    return choice("fp32", "int32")(DTYPE_ALIASES.get(text, text))


def optional_k(text: str | None, option: str = "-k") -> int | None:
    """Fastest-K: None for 'world' or nothing."""
    return None if text in (None, "", "world") else one_value(text, positive_int, option)


def add_world_option(parser: argparse.ArgumentParser, config: type) -> None:
    add_config_option(parser, config, "--world", "ranks (torchrun or Slurm set their own)")


def world(args: argparse.Namespace) -> int:
    """--world as given (under torchrun/Slurm the library uses the world they started)."""
    return one_value(args.world, positive_int, "--world")


def add_job_options(parser: argparse.ArgumentParser, *, timers: bool = True) -> None:
    """Switch, packet, timer and fault options (`timers=False` when a command sweeps STO and RTO itself)."""
    group = parser.add_argument_group("switch job")
    group.add_argument("--switch", default=None, metavar="HOST:PORT",
                       help="use a running `stepscope innet switch` (default: start one for this run)")
    add_config_option(group, JobConfig, "--pipes", "switch pipelines 1-4: k = 64 x pipes values per packet")
    group.add_argument("--values-per-packet", default=config_default(JobConfig, "values_per_packet"), metavar="K",
                       help="override k (emulation only; up to 16368 values = one 64 KiB datagram)")
    add_config_option(group, JobConfig, "--slots", "slot pool size s per job (packets in flight)")
    add_config_option(group, JobConfig, "--window", "most outstanding packets per worker (default: slots)")
    if timers:
        add_config_option(group, JobConfig, "--sto-ms", "straggler timeout in ms (rounded up to 65.536 us ticks)")
        add_config_option(group, JobConfig, "--sto-ticks", "straggler timeout in switch ticks (overrides --sto-ms)")
        add_config_option(group, JobConfig, "--rto-ms", "first retransmission timeout in ms, or auto "
                          "(srtt + 4 rttvar); doubles per retry of a packet", none="auto")
    add_config_option(group, JobConfig, "--rto-max-ms", "largest retransmission timeout")
    add_config_option(group, JobConfig, "--sender-threads", "worker threads that quantize and send")
    add_config_option(group, JobConfig, "--timeout-s", "an op without progress this long fails")
    faults = parser.add_argument_group("fault injection")
    add_config_option(faults, FaultConfig, "--drop", "drop probability, both directions", field="drop_up")
    faults.add_argument("--drop-up", default=None, help="drop probability worker -> switch (overrides --drop)")
    faults.add_argument("--drop-down", default=None, help="drop probability switch -> worker (overrides --drop)")
    add_config_option(faults, FaultConfig, "--duplicate", "duplication probability (both directions)")
    add_config_option(faults, FaultConfig, "--reorder", "reordering probability (both directions)")
    faults.add_argument("--straggler", default=None, metavar="SPEC",
                        help="e.g. 'ranks=1;delay=20ms;prob=1;steps=2-5' (steps 0-based)")
    faults.add_argument("--fault-seed", type=int, default=field_default(FaultConfig, "seed"),
                        help="seed of the fault decisions (default %(default)s)")


def job_config(args: argparse.Namespace, *, timers: bool = True, straggler: bool = True) -> JobConfig:
    """The JobConfig template of the job and fault options (rank, world and job id are set per rank;
    `timers=False` leaves STO and RTO to the command, which sweeps them; `straggler=False` when the command
    injects `--straggler` itself)."""
    drop = one_value(args.drop, fraction, "--drop")
    faults = FaultConfig(
        drop_up=drop if args.drop_up is None else one_value(args.drop_up, fraction, "--drop-up"),
        drop_down=drop if args.drop_down is None else one_value(args.drop_down, fraction, "--drop-down"),
        duplicate=one_value(args.duplicate, probability, "--duplicate"),
        reorder=one_value(args.reorder, probability, "--reorder"), seed=args.fault_seed,
        straggler=StragglerSpec.parse(args.straggler) if straggler and args.straggler else None)
    timer_settings = {} if not timers else dict(
        sto_ms=one_value(args.sto_ms, float, "--sto-ms"),
        sto_ticks=optional_value(args.sto_ticks, non_negative_int, "--sto-ticks"),
        rto_ms=None if args.rto_ms == "auto" else one_value(args.rto_ms, positive_float, "--rto-ms"))
    return JobConfig(pipes=one_value(args.pipes, positive_int, "--pipes"),
                     values_per_packet=optional_value(args.values_per_packet, positive_int, "--values-per-packet"),
                     slots=one_value(args.slots, positive_int, "--slots"),
                     window=optional_value(args.window, positive_int, "--window"),
                     rto_max_ms=one_value(args.rto_max_ms, positive_float, "--rto-max-ms"),
                     sender_threads=one_value(args.sender_threads, non_negative_int, "--sender-threads"),
                     timeout_s=one_value(args.timeout_s, positive_float, "--timeout-s"), faults=faults,
                     **timer_settings)
