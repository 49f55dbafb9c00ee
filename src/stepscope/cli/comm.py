"""`stepscope comm`: collective communication benchmark with nccl-tests conventions, per backend and
world size; or `--import` nccl-tests logs. Parsing and printing only: the work is `dist.comm_bench`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stepscope.cli.options import choice, non_negative_int, parse_list, positive_float, positive_int
from stepscope.distributed.launch.ranks import MAX_RANKS_PER_CORE
from stepscope.errors import UsageError
from stepscope.results.store import DEFAULT_OUT
from stepscope.results.views import FORMATS

ALL = "all"
OUTPUT_FORMATS = FORMATS + ("nccl-tests",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "comm", help="benchmark collectives per backend and world size (nccl-tests conventions)",
        description="Time collectives (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, "
                    "barrier) on gloo, nccl, mpi (mpi4py under mpiexec) or oneccl, with nccl-tests' algbw/busbw "
                    "and a correctness check per size. Comma lists sweep.")
    what = parser.add_argument_group("what to measure (comma lists sweep)")
    what.add_argument("--op", default=None, help="collective(s), or 'all' (default all_reduce)")
    what.add_argument("--sizes", default="1K:16M:x4",
                      help="sizes: list (1M,10M,100M) or range MIN:MAX:xFACTOR / MIN:MAX:+STEP; K/M/G are powers "
                           "of 1024 as in nccl-tests (default 1K:16M:x4)")
    what.add_argument("--dtype", default="fp32", help="fp32|fp16|bf16|fp64|int8|uint8|int32|int64 (default fp32)")
    what.add_argument("--world", default=None, help="world size(s), one job each (default 2)")
    what.add_argument("--backend", default="gloo", help="gloo|nccl|mpi|oneccl|horovod, or auto: nccl when every "
                      "rank has a GPU, else gloo (default gloo)")
    what.add_argument("--mode", default="per-op", help="per-op (each call waited) and/or batch (all calls in "
                      "flight, one wait); default per-op")
    what.add_argument("--place", default="out,in", help="out (out-of-place) and/or in (in-place); default out,in")
    what.add_argument("--iters", default="20", help="timed calls per point (default 20)")
    what.add_argument("--warmup", default="5", help="untimed calls per point before timing (default 5)")
    what.add_argument("--root", default="0", help="root rank of broadcast and reduce (default 0)")
    what.add_argument("--threads", default=None, help="CPU threads per rank (default: cores / ranks)")
    what.add_argument("--timeout", default="300", help="seconds a rank may wait on a peer (mpi: job silence) "
                      "before the run is stopped (default 300)")
    what.add_argument("--oversubscribe", action="store_true", help="start more local ranks than the limit of "
                      f"{MAX_RANKS_PER_CORE} per CPU core (ranks started by torchrun/srun are not limited)")
    extra = parser.add_argument_group("reports")
    extra.add_argument("--tally", action="store_true", help="per-backend tables of host API calls, device activity "
                       "and memory traffic for every point (torch.profiler; timing wrappers for mpi)")
    extra.add_argument("--fit", action="store_true", help="least-squares α–β fit per backend, op and world size "
                       "(stored as records for calibration)")
    extra.add_argument("--plot", default=None, help="PNG path (default <out>/comm.png)")
    extra.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    extra.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                       help="read an nccl-tests log instead of measuring (repeatable); --op/--world are hints "
                            "for logs that do not say")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=DEFAULT_OUT, help=f"folder for JSON-Lines records (default {DEFAULT_OUT})")
    output.add_argument("--format", default="table", choices=OUTPUT_FORMATS, help="how to print results")
    output.add_argument("--resume", action="store_true", help="skip points already recorded in --out; --fit and "
                        "the plot use the recorded points of this sweep too")
    parser.set_defaults(func=run)




def build_config(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The validated CommConfig of the command line (UsageError on any bad value), and notes to print
    (what `--backend auto` chose)."""
    from stepscope.distributed.collectives.benchmark import CommConfig, resolve_auto
    from stepscope.distributed.collectives.ops import DTYPES, OPS
    from stepscope.distributed.collectives.points import MODES, PLACES
    from stepscope.distributed.collectives.sizes import parse_sizes

    ops = list(OPS) if args.op == ALL else parse_list(args.op or "all_reduce", choice(*OPS), "--op")
    worlds = tuple(parse_list(args.world or "2", positive_int, "--world"))
    backends, auto_note = resolve_auto(tuple(parse_list(args.backend, str, "--backend")), worlds)
    config = CommConfig(
        backends=backends, worlds=worlds, oversubscribe=args.oversubscribe,
        ops=tuple(dict.fromkeys(ops)), sizes=tuple(parse_sizes(args.sizes)),
        dtypes=tuple(parse_list(args.dtype, choice(*DTYPES), "--dtype")),
        modes=tuple(parse_list(args.mode, choice(*MODES), "--mode")),
        places=tuple(parse_list(args.place, choice(*PLACES), "--place")),
        iters=parse_list(args.iters, positive_int, "--iters")[0],
        warmup=parse_list(args.warmup, non_negative_int, "--warmup")[0],
        root=parse_list(args.root, non_negative_int, "--root")[0],
        threads=None if args.threads is None else parse_list(args.threads, positive_int, "--threads")[0],
        timeout_s=parse_list(args.timeout, positive_float, "--timeout")[0], tally=args.tally)
    for option, text in (("--iters", args.iters), ("--warmup", args.warmup), ("--root", args.root),
                         ("--threads", args.threads), ("--timeout", args.timeout)):
        if text is not None and "," in str(text):
            raise UsageError(f"{option} takes one value, got {text!r}")
    config.validate()
    return config, [auto_note] if auto_note else []


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.results.store import RecordStore

    if args.imports:
        return _run_import(args)
    config, config_notes = build_config(args)
    store = RecordStore(args.out, "comm").check_writable()
    plot_path = None if args.no_plot else Path(args.plot or Path(args.out) / "comm.png")

    from stepscope.distributed.collectives.benchmark import plan_jobs, run_comm

    reporting = _is_reporting_rank()
    printer = Printer("table" if args.format == "nccl-tests" else args.format)
    side = Printer("table", stream=sys.stderr) if args.format != "table" else printer  # tallies, notes
    if reporting:
        for note in config_notes:
            side.note(f"note: {note}")
        for job in plan_jobs(config):
            for note in job.roundings:
                side.note(f"note: {note.message()}")
            for note in job.skipped:
                side.note(f"note: {note}")
    collected: list[dict[str, Any]] = []

    def show(result: Any) -> None:
        first = not collected
        collected.extend(result.records)
        if not reporting:
            return
        if result.skipped_done:
            side.note(f"skipped {result.skipped_done} point(s) of {result.job.backend} on {result.job.world_size} "
                      f"ranks already in {store.path} (--resume)")
        _print_records(args.format, printer, side, result.records, units=first)
        for record, tally in zip(result.records, result.tallies):
            if tally is not None:
                _print_tally(side if args.format != "table" else printer, record, tally)

    run_comm(config, store, resume=args.resume, on_job=show)
    if not reporting:
        return 0
    sweep = collected
    if args.resume:  # fit and plot the whole sweep: the points of earlier runs of it and this run's
        from stepscope.distributed.collectives.benchmark import sweep_records

        sweep = sweep_records(config, store)
        earlier = len(sweep) - len({r["key"] for r in collected} & {r["key"] for r in sweep})
        if earlier:
            side.note(f"fit and plot use {len(sweep)} point(s) of this sweep: {earlier} from earlier runs in "
                      f"{store.path} (--resume)")
    return _finish(args, printer, side, store, sweep, plot_path, checked=collected)


def _run_import(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.distributed.collectives.nccl_tests_format import import_records
    from stepscope.distributed.collectives.ops import OPS
    from stepscope.results.store import RecordStore

    op_hint = None if args.op is None else parse_list(args.op, choice(*OPS), "--op")
    world_hint = None if args.world is None else parse_list(args.world, positive_int, "--world")
    if (op_hint and len(op_hint) > 1) or (world_hint and len(world_hint) > 1):
        raise UsageError("with --import, --op and --world are single hints for logs that do not say")
    records = []
    for path in args.imports:
        records.extend(import_records(path, op_hint=op_hint[0] if op_hint else None,
                                      world_hint=world_hint[0] if world_hint else None))
    store = RecordStore(args.out, "comm").check_writable()
    done = store.done_keys() if args.resume else set()
    fresh = [r for r in records if r["key"] not in done]
    for record in fresh:
        store.append(record)
    printer = Printer("table" if args.format == "nccl-tests" else args.format)
    side = Printer("table", stream=sys.stderr) if args.format != "table" else printer
    printer.note(f"imported {len(records)} point(s) from {len(args.imports)} file(s)"
                 + (f"; {len(records) - len(fresh)} already in {store.path}" if len(fresh) < len(records) else ""))
    _print_records(args.format, printer, side, records)
    plot_path = None if args.no_plot else Path(args.plot or Path(args.out) / "comm.png")
    return _finish(args, printer, side, store, records, plot_path)


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


def _finish(args: argparse.Namespace, printer: Any, side: Any, store: Any, records: list[dict[str, Any]],
            plot_path: Path | None, *, checked: list[dict[str, Any]] | None = None) -> int:
    """α–β fits and the plot of `records`, and the exit code: 1 when a point of `checked` (default:
    `records`; with --resume, only this run's points) returned wrong results."""
    fits: list[dict[str, Any]] = []
    if args.fit:
        from stepscope.distributed.collectives.alpha_beta import fit_records
        from stepscope.distributed.collectives.report import fit_rows

        fits, notes = fit_records(records)
        stored = {r["key"]: r.get("metrics") for r in store.records() if r.get("config", {}).get("record") == "fit"}
        for fit in fits:
            if stored.get(fit["key"]) != fit["metrics"]:  # a rerun of `--resume --fit` adds no duplicate
                store.append(fit)
        if fits:
            (printer if args.format != "nccl-tests" else side).emit(
                fit_rows(fits), title="α–β fit: t(S) = alpha + busbw_factor * S / beta (relative least squares)")
        for note in notes:
            side.note(f"note: {note}")
    if plot_path is not None:
        from stepscope.distributed.collectives.plot import plot_comm

        written = plot_comm(records + fits, plot_path, title="stepscope comm")
        side.note(f"plot: {written}" if written else "plot: nothing to plot (no measured sizes)")
    side.note(f"records: {store.path}")
    wrong = [r for r in (records if checked is None else checked) if r.get("status") == "mismatch"]
    if wrong:
        print(f"stepscope: {len(wrong)} point(s) returned wrong results (see #wrong)", file=sys.stderr)
        return 1
    return 0


def _is_reporting_rank() -> bool:
    """Under torchrun/Slurm every rank runs this command; only rank 0 prints."""
    from stepscope.distributed.launch.launcher import external_launch_env

    external = external_launch_env()
    return external is None or external["rank"] == 0
