"""Command-line options shared by the innet commands (switch job, packets, timers, fault injection) and
their conversion into a validated `JobConfig`. Parsing only; `stepscope.cli.innet` defines the commands.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from stepscope.cli.options import non_negative_int, positive_float, positive_int
from stepscope.errors import UsageError


def fraction(text: str) -> float:
    """A probability in [0, 1)."""
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError(text)
    return value


def probability(text: str) -> float:
    """A probability in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


def size_bytes(text: str) -> int:
    """'4096', '64K', '1M', '1.5MiB' -> bytes (K, M, G are powers of 1024, as in `stepscope comm --sizes`)."""
    from stepscope.distributed.collectives.sizes import parse_size

    value = parse_size(text)
    if value <= 0:
        raise ValueError(text)
    return value


def convert(text: Any, function: Callable[[Any], Any], option: str) -> Any:
    """`function(text)`, with a bad value reported as a usage error naming the option."""
    try:
        return function(text)
    except (ValueError, TypeError):
        raise UsageError(f"invalid value {text!r} for {option}") from None


def optional_k(text: str | None, option: str = "-k") -> int | None:
    """Fastest-K: None for 'world' or nothing."""
    return None if text in (None, "", "world") else convert(text, positive_int, option)


def add_job_options(parser: argparse.ArgumentParser, *, timers: bool = True) -> None:
    """Switch, packet, timer and fault options (`timers=False` when a command sweeps STO and RTO itself)."""
    group = parser.add_argument_group("switch job")
    group.add_argument("--switch", default=None, metavar="HOST:PORT",
                       help="use a running `stepscope innet switch` (default: start one for this run)")
    group.add_argument("--pipes", default="4", help="switch pipelines 1-4: k = 64 x pipes values per packet")
    group.add_argument("--values-per-packet", default=None, metavar="K",
                       help="override k (emulation only; up to 16368 values = one 64 KiB datagram)")
    group.add_argument("--slots", default="64", help="slot pool size s per job (packets in flight)")
    group.add_argument("--window", default=None, help="most outstanding packets per worker (default: slots)")
    if timers:
        group.add_argument("--sto-ms", default="1", help="straggler timeout in ms (rounded up to 65.536 us ticks)")
        group.add_argument("--sto-ticks", default=None, help="straggler timeout in switch ticks (overrides --sto-ms)")
        group.add_argument("--rto-ms", default="auto", help="first retransmission timeout in ms, or auto "
                           "(srtt + 4 rttvar); doubles per retry of a packet")
    group.add_argument("--rto-max-ms", default="200", help="largest retransmission timeout")
    group.add_argument("--sender-threads", default="0", help="worker threads that quantize and send")
    group.add_argument("--timeout-s", default="30", help="an op without progress this long fails")
    faults = parser.add_argument_group("fault injection")
    faults.add_argument("--drop", default="0", help="drop probability, both directions")
    faults.add_argument("--drop-up", default=None, help="drop probability worker -> switch (overrides --drop)")
    faults.add_argument("--drop-down", default=None, help="drop probability switch -> worker (overrides --drop)")
    faults.add_argument("--duplicate", default="0", help="duplication probability (both directions)")
    faults.add_argument("--reorder", default="0", help="reordering probability (both directions)")
    faults.add_argument("--straggler", default=None, metavar="SPEC",
                        help="e.g. 'ranks=1;delay=20ms;prob=1;steps=2-5' (steps 0-based)")
    faults.add_argument("--fault-seed", default="0", help="seed of the fault decisions")


def job_config(args: argparse.Namespace, world: int, *, timers: bool = True) -> Any:
    """A validated JobConfig template from the job and fault options (rank and job id are set per rank;
    `timers=False` leaves STO and RTO at their defaults for commands that sweep them)."""
    from stepscope.innet.faults import FaultConfig, StragglerSpec
    from stepscope.innet.worker import JobConfig

    drop = convert(args.drop, fraction, "--drop")
    faults = FaultConfig(
        drop_up=convert(args.drop_up, fraction, "--drop-up") if args.drop_up is not None else drop,
        drop_down=convert(args.drop_down, fraction, "--drop-down") if args.drop_down is not None else drop,
        duplicate=convert(args.duplicate, probability, "--duplicate"),
        reorder=convert(args.reorder, probability, "--reorder"),
        seed=convert(args.fault_seed, int, "--fault-seed"),
        straggler=StragglerSpec.parse(args.straggler) if args.straggler else None)
    options: dict[str, Any] = dict(
        switch=args.switch or "127.0.0.1:1", world=world, pipes=convert(args.pipes, positive_int, "--pipes"),
        values_per_packet=(convert(args.values_per_packet, positive_int, "--values-per-packet")
                           if args.values_per_packet else None),
        slots=convert(args.slots, positive_int, "--slots"),
        window=convert(args.window, positive_int, "--window") if args.window else None,
        rto_max_ms=convert(args.rto_max_ms, positive_float, "--rto-max-ms"),
        sender_threads=convert(args.sender_threads, non_negative_int, "--sender-threads"),
        timeout_s=convert(args.timeout_s, positive_float, "--timeout-s"), faults=faults)
    if timers:
        options["sto_ms"] = convert(args.sto_ms, float, "--sto-ms")
        options["sto_ticks"] = convert(args.sto_ticks, non_negative_int, "--sto-ticks") if args.sto_ticks else None
        options["rto_ms"] = None if args.rto_ms == "auto" else convert(args.rto_ms, positive_float, "--rto-ms")
    config = JobConfig(**options)
    config.validate()
    if faults.straggler is not None:
        faults.straggler.validate(world)
    return config
