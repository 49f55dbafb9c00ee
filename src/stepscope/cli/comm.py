"""`stepscope comm`: collective communication benchmark with nccl-tests conventions, per backend and world size;
or `--import` nccl-tests logs. The work, the records, the fits and the plot:
`stepscope.distributed.collectives.session` (`run_comm`, `import_comm`)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

from stepscope.cli.options import (
    add_alias,
    add_config_option,
    add_output_options,
    add_plot_options,
    add_seed_option,
    choice,
    config_default,
    non_negative_float,
    non_negative_int,
    one_value,
    optional_value,
    parse_list,
    positive_float,
    positive_int,
    unique,
)
from stepscope.cli.options.distributed import add_launch_options
from stepscope.distributed.collectives.config import CommConfig
from stepscope.distributed.collectives.sizes import format_bytes
from stepscope.results.views import FORMATS

NAME = "comm"
HELP = "benchmark collectives per backend and world size (nccl-tests conventions)"
DESCRIPTION = ("Time collectives (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, "
               "all_to_allv, barrier) on gloo, nccl, mpi (mpi4py under mpiexec) or oneccl, with nccl-tests' "
               "algbw/busbw and a correctness check per size. Comma lists sweep.")


ALL = "all"
OUTPUT_FORMATS = (*FORMATS, "nccl-tests")


def add_options(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to measure (comma lists sweep)")
    option = partial(add_config_option, what, CommConfig)
    # --op and --world stay None when not given: with --import they are hints for logs that do not say
    what.add_argument("--op", default=None,
                      help=f"collective(s), or 'all' (default {config_default(CommConfig, 'ops')})")
    option("--sizes", "sizes: list (1M,10M,100M) or range MIN:MAX:xFACTOR / MIN:MAX:+STEP; K/M/G are powers of "
           "1024 as in nccl-tests", show=format_bytes)
    option("--dtype", "fp32|fp16|bf16|fp64|int8|uint8|int32|int64", field="dtypes")
    what.add_argument("--world", default=None,
                      help=f"world size(s), one job each (default {config_default(CommConfig, 'worlds')})")
    option("--call-mode", "per-op (each call waited) and/or batch (all calls in flight, one wait)", field="modes")
    add_alias(what, "--mode", "--call-mode")
    option("--place", "out (out-of-place) and/or in (in-place)", field="places")
    option("--iters", "timed calls per point")
    option("--warmup", "untimed calls per point before timing")
    option("--root", "root rank of broadcast and reduce")
    option("--skew", "all_to_allv: Zipf exponent(s) of the token-per-expert popularity that splits each rank's "
           "send buffer unevenly (0: the equal all_to_all split)", field="skews")
    add_seed_option(what, CommConfig, help="all_to_allv: which ranks are hot (the split matrix follows from it)")
    what.add_argument("--threads", default=None, help="CPU threads per rank (default: cores / ranks)")
    add_launch_options(what, CommConfig, backend_field="backends",
                       backends="gloo|nccl|mpi|oneccl|horovod, or auto: nccl when every rank has a GPU, else gloo",
                       timeout_help="seconds a rank may wait on a peer (mpi: job silence)")
    extra = parser.add_argument_group("reports")
    extra.add_argument("--tally", nargs="?", const="api", choices=("api", "syscalls"), default=None,
                       help="api (the default of a bare --tally): per-backend tables of host API calls, device "
                       "activity and memory traffic for every point (torch.profiler; timing wrappers for mpi); "
                       "syscalls: each job again under strace, what the backend does beneath its API (system "
                       "calls by kind, processes, threads) side by side per size, with the tracer's overhead")
    extra.add_argument("--fit", action="store_true", help="least-squares α–β fit per backend, op and world size "
                       "(stored as records for calibration)")
    extra.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                       help="read an nccl-tests log instead of measuring (repeatable); --op/--world are hints "
                            "for logs that do not say")
    add_plot_options(parser, "comm.png")
    add_output_options(parser, formats=OUTPUT_FORMATS, resume_help="skip points already recorded in --out; --fit "
                       "and the plot use the recorded points of this sweep too")


def build_config(args: argparse.Namespace) -> CommConfig:
    """The CommConfig of the command line (value types checked here; the request itself by the library)."""
    from stepscope.distributed.collectives.ops import DTYPES, OPS
    from stepscope.distributed.collectives.points import CALL_MODES, PLACES
    from stepscope.distributed.collectives.sizes import parse_sizes

    ops = list(OPS) if args.op == ALL else parse_list(args.op or default_text("ops"), choice(*OPS), "--op")
    return CommConfig(
        backends=tuple(unique(parse_list(args.backend, str, "--backend"))),
        worlds=tuple(unique(parse_list(args.world or default_text("worlds"), positive_int, "--world"))),
        oversubscribe=args.oversubscribe, ops=tuple(dict.fromkeys(ops)), sizes=tuple(parse_sizes(args.sizes)),
        dtypes=tuple(unique(parse_list(args.dtype, choice(*DTYPES), "--dtype"))),
        modes=tuple(unique(parse_list(args.call_mode, choice(*CALL_MODES), "--call-mode"))),
        places=tuple(unique(parse_list(args.place, choice(*PLACES), "--place"))),
        iters=one_value(args.iters, positive_int, "--iters"),
        warmup=one_value(args.warmup, non_negative_int, "--warmup"),
        root=one_value(args.root, non_negative_int, "--root"),
        skews=tuple(dict.fromkeys(parse_list(args.skew, non_negative_float, "--skew"))), seed=args.seed,
        threads=optional_value(args.threads, positive_int, "--threads"),
        timeout_s=one_value(args.timeout_s, positive_float, "--timeout-s"), tally=args.tally == "api",
        syscalls=args.tally == "syscalls")


def default_text(name: str) -> str:
    return str(config_default(CommConfig, name))


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer

    printer = Printer("table" if args.format == "nccl-tests" else args.format)
    side = Printer("table", stream=sys.stderr) if args.format != "table" else printer  # tallies, notes
    plot = None if args.no_plot else (args.plot or Path(args.out) / "comm.png")
    if args.imports:
        from stepscope.distributed.collectives.ops import OPS
        from stepscope.distributed.collectives.session import import_comm

        op_hint = optional_value(args.op, choice(*OPS), "--op (a hint with --import)")
        world_hint = optional_value(args.world, positive_int, "--world (a hint with --import)")
        outcome = import_comm(args.imports, args.out, resume=args.resume, op_hint=op_hint, world_hint=world_hint,
                              fit=args.fit, plot=plot, on_note=printer.note)
        _print_records(args.format, printer, side, outcome.records)
    else:
        from stepscope.distributed.collectives.session import run_comm

        first = [True]

        def show(result: Any) -> None:
            _print_records(args.format, printer, side, result.records, units=first[0])
            first[0] = False
            for record, tally in zip(result.records, result.tallies, strict=True):
                if tally is not None:
                    _print_tally(side if args.format != "table" else printer, record, tally)

        outcome = run_comm(build_config(args), args.out, resume=args.resume, fit=args.fit, plot=plot,
                           on_note=side.note, on_job=show)
        if not outcome.reporting:
            return 0
    if outcome.syscalls:
        print_syscalls(args.format, printer, outcome.syscalls)
    if outcome.fits:
        from stepscope.distributed.collectives.report import fit_rows

        (printer if args.format != "nccl-tests" else side).emit(
            fit_rows(outcome.fits), title="α–β fit: t(S) = alpha + busbw_factor * S / beta (relative least squares)")
    for note in outcome.fit_notes:
        side.note(f"note: {note}")
    if plot is not None:
        side.note(f"plot: {outcome.plot}" if outcome.plot else "plot: nothing to plot (no measured sizes)")
    side.note(f"records: {args.out}/comm.jsonl")
    if outcome.wrong:
        print(f"stepscope: {len(outcome.wrong)} point(s) returned wrong results (see #wrong)", file=sys.stderr)
        return 1
    return 0


def _print_records(fmt: str, printer: Any, side: Any, records: list[dict[str, Any]], *, units: bool = True) -> None:
    from stepscope.distributed.collectives.nccl_tests_format import write_nccl_tests
    from stepscope.distributed.collectives.report import flat_rows, status_notes, table_blocks, units_note

    if fmt == "nccl-tests":
        sys.stdout.write(write_nccl_tests(records))
        sys.stdout.flush()
    elif fmt == "table":
        if records and units:
            printer.note(units_note(records) + "\n")
        for title, rows in table_blocks(records):
            printer.emit(rows, title=title)
    else:
        printer.emit(flat_rows(records))
    for note in status_notes(records):
        side.note(note)


def _print_tally(printer: Any, record: dict[str, Any], tally: dict[str, Any]) -> None:
    from stepscope.distributed.collectives.sizes import format_bytes
    from stepscope.distributed.collectives.tally import tally_tables

    c = record["config"]
    place = "" if c.get("in_place") is None else (" in-place" if c["in_place"] else " out-of-place")
    size = f" {format_bytes(c['size_bytes'])}B" if c.get("size_bytes") else ""
    dtype = "" if c["op"] == "barrier" else f" {c['dtype']}"
    label = f"{c['op']}{size}{dtype} {c['mode']}{place}, {c['iters']} calls"
    for title, rows, empty in tally_tables(tally, c["backend"], label):
        printer.note(title)  # as its own line: a table title would wrap at the table's width
        if rows:
            printer.emit(rows)
        else:
            printer.note(f"  {empty}\n")


def print_syscalls(fmt: str, printer: Any, records: list[dict[str, Any]]) -> None:
    """`syscalls` records (comm's or innet bench's): headers and side-by-side tables, or flat rows (csv/json)."""
    from stepscope.distributed.collectives.syscall_report import flat_rows, headers, side_by_side

    if fmt not in ("table", "md", "nccl-tests"):
        printer.emit(flat_rows(records))
        return
    printer.note("beneath the API (strace): processes and threads alive during the timed calls, launcher included")
    for line in headers(records):
        printer.note(line)
    printer.note("  device: none (CPU backends move data with host threads)\n")
    for title, rows in side_by_side(records):
        printer.note(title)  # as its own line: a table title would wrap at the table's width
        printer.emit(rows)
