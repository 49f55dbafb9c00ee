"""`stepscope attention`: naive, SDPA, compiled, flash-torch and flash-triton attention, side by side.

Each point is checked against fp64 first (failing: `mismatch` row), then timed with the other
implementations in rotating order; the table shows time, TFLOP/s, the ratio to sdpa and naive measured
in the same rounds, peak memory and bytes saved for backward. `--grid` runs a preset sweep; a PNG of
time and memory against sequence length is written when more than one length is swept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stepscope.cli.options import (
    add_output_options,
    choice,
    non_negative_float,
    non_negative_int,
    parse_list,
    positive_int,
)
from stepscope.errors import UsageError

_MAIN_COLUMNS = ("impl", "status")


def register(subparsers: argparse._SubParsersAction) -> None:
    from stepscope.measure.attention.presets import PRESETS

    grids = "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items())
    parser = subparsers.add_parser(
        "attention", help="benchmark attention implementations (naive, sdpa, compiled, flash-torch, flash-triton)",
        description="Check every implementation against fp64, then time them side by side (rotating order) "
                    "and measure peak memory. Comma lists sweep; options given override the --grid preset.")
    parser.add_argument("--grid", default=None, help=f"preset sweep ({grids})")
    parser.add_argument("--impl", default=None,
                        help="comma list of naive,sdpa,compiled,flash-torch,flash-triton "
                             "(default naive,sdpa,flash-torch)")
    sizes = parser.add_argument_group("problem (comma lists sweep)")
    sizes.add_argument("--batch", default=None, help="batch sizes (default 8)")
    sizes.add_argument("--heads", default=None, help="heads (default 1)")
    sizes.add_argument("--seq", default=None, help="sequence lengths (default 1024)")
    sizes.add_argument("--dim", default=None, help="head dimensions (default 64)")
    sizes.add_argument("--dtype", default=None, help="fp32, bf16, fp16 (default fp32)")
    sizes.add_argument("--causal", default=None, action=argparse.BooleanOptionalAction,
                       help="causal mask, top-left aligned (default: off)")
    sizes.add_argument("--pass", dest="passes", default=None, help="fwd, bwd, fwd-bwd (default all three)")
    run = parser.add_argument_group("measurement")
    run.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")
    run.add_argument("--warmup", default=None, help="untimed rounds after the check and memory runs (default 1)")
    run.add_argument("--iters", default=None, help="timed rounds (default 5)")
    run.add_argument("--threads", default=None, help="CPU intra-op threads (default: PyTorch's choice)")
    run.add_argument("--check-rows", default=None, help="query rows checked against fp64 at long sequences (256)")
    run.add_argument("--seed", type=int, default=0, help="seed of q, k, v and dO")
    run.add_argument("--startup", default=None,
                     help="seconds of warm-up on a tiny problem before the first point (default 1)")
    run.add_argument("--plot", default=None, help="PNG path (default <out>/attention-<grid|sweep>.png)")
    run.add_argument("--no-plot", action="store_true", help="do not write the plot")
    add_output_options(parser)
    parser.set_defaults(func=run_command)


def bench_config(args: argparse.Namespace):
    """The AttentionBenchConfig from the preset (if any) and the options given, validated types."""
    from stepscope.kernels.reference import PASSES
    from stepscope.measure.attention.benchmark import AttentionBenchConfig
    from stepscope.measure.attention.check import TOLERANCE
    from stepscope.measure.attention.presets import preset_fields
    from stepscope.measure.device import resolve_device
    from stepscope.nn.attention import attention_backends

    device = resolve_device(args.device)
    fields = preset_fields(args.grid, device.type) if args.grid else {}
    lists = {"impls": ("--impl", args.impl, choice(*attention_backends())), "batch": ("--batch", args.batch, positive_int),
             "heads": ("--heads", args.heads, positive_int), "seq": ("--seq", args.seq, positive_int),
             "dim": ("--dim", args.dim, positive_int), "dtype": ("--dtype", args.dtype, choice(*TOLERANCE)),
             "passes": ("--pass", args.passes, choice(*PASSES))}
    for name, (option, text, convert) in lists.items():
        if text is not None:
            fields[name] = tuple(dict.fromkeys(parse_list(text, convert, option)))
    if args.causal is not None:
        fields["causal"] = (args.causal,)
    for name, option, text, convert in (("warmup", "--warmup", args.warmup, non_negative_int),
                                        ("iters", "--iters", args.iters, positive_int),
                                        ("threads", "--threads", args.threads, positive_int),
                                        ("check_rows", "--check-rows", args.check_rows, positive_int),
                                        ("startup_s", "--startup", args.startup, non_negative_float)):
        if text is not None:
            values = parse_list(text, convert, option)
            if len(values) != 1:
                raise UsageError(f"{option} takes one value, got {text!r}")
            fields[name] = values[0]
    return AttentionBenchConfig(device=args.device, seed=args.seed, **fields)




def plot_path(args: argparse.Namespace, grid: str | None) -> Path:
    """Where the PNG goes; its folder must be creatable (checked before any work)."""
    path = Path(args.plot) if args.plot else Path(args.out) / f"attention-{grid or 'sweep'}.png"
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"--plot must end in .png, .svg or .pdf, got {str(path)!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot write the plot to {path}: {error.strerror or error}") from None
    return path


def point_rows(records: list[dict], passes: tuple[str, ...], fmt: str) -> list[dict]:
    """One row per implementation: status, then per pass the median and rates, then memory and error."""
    rows = []
    for record in records:
        metrics, config = record["metrics"], record["config"]
        row = {} if fmt == "table" else {k: config[k] for k in ("batch", "heads", "seq", "dim", "dtype", "causal")}
        row.update(impl=config["impl"], status=record["status"])
        for pass_ in passes:
            prefix = pass_.replace("-", "_")
            row[f"{prefix}_ms"] = metrics.get(f"{prefix}_ms_median")
            row[f"{prefix}_TFLOPps"] = metrics.get(f"{prefix}_TFLOPps")
        main = next(p for p in ("fwd-bwd", "bwd", "fwd") if p in passes).replace("-", "_")
        row[f"{main}_vs_sdpa"] = metrics.get(f"{main}_ratio_vs_sdpa")
        row[f"{main}_vs_naive"] = metrics.get(f"{main}_ratio_vs_naive")
        row["fwd_peak_MiB"] = metrics.get("fwd_peak_MiB")
        row["bwd_peak_MiB"] = metrics.get("bwd_peak_MiB")
        row["peak_vs_naive"] = metrics.get("bwd_peak_ratio_vs_naive", metrics.get("fwd_peak_ratio_vs_naive"))
        row["saved_MiB"] = metrics.get("saved_beyond_inputs_MiB")
        row["first_call_s"] = metrics.get("first_call_s")  # compiled: compilation included
        errors = [v for k, v in metrics.items() if k.startswith("err_")]
        row["max_err"] = max(errors) if errors else None
        if record.get("note"):
            row["note"] = record["note"]
        rows.append(row)
    return rows


def run_command(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.attention.benchmark import run_attention_sweep
    from stepscope.results.store import RecordStore, point_key

    config = bench_config(args)
    config.validate()
    store = RecordStore(args.out, "attention").check_writable()
    plot = None if args.no_plot or (len(config.seq) < 2 and not args.plot) else plot_path(args, config.grid)
    printer = Printer(args.format)

    def show(point, records) -> None:
        rows = point_rows(records, config.passes, args.format)
        every = list(dict.fromkeys([c for row in rows for c in row] + ["note"]))
        if args.format == "table":  # a table per point: only the columns this point has values for
            columns = [c for c in every if any(r.get(c) is not None for r in rows)]
        else:  # one CSV header / JSON shape for the whole sweep
            columns = every
        printer.emit(rows, title=point.label() + f" (threads {records[0]['env'].get('threads')})", columns=columns)

    outcome = run_attention_sweep(config, store, resume=args.resume, on_point=show)
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} record(s) already in {store.path} (--resume)")
    printer.note(f"records: {store.path}")
    if plot is not None:
        from stepscope.measure.attention.plot import plot_attention

        # every record of this sweep's points, also those a --resume skipped
        keys = {point_key("attention", config.record_config(point, impl))
                for point in config.points() for impl in config.impls}
        records = [r for r in store.records() if r.get("key") in keys]
        if any(r["status"] == "ok" for r in records):
            printer.note(f"plot: {plot_attention(records, plot)}")
    return 0
