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
    add_alias,
    add_device_option,
    add_output_options,
    add_plot_options,
    add_seed_option,
    choice,
    config_default,
    field_default,
    non_negative_float,
    non_negative_int,
    one_value,
    parse_list,
    positive_int,
)
from stepscope.measure.attention.config import TOLERANCE, AttentionBenchConfig

NAME = "attention"
HELP = "benchmark attention implementations (naive, sdpa, compiled, flash-torch, flash-triton)"
DESCRIPTION = ("Check every implementation against fp64, then time them side by side (rotating order) and measure "
               "peak memory. Comma lists sweep; options given override the --grid preset.")




def add_options(parser: argparse.ArgumentParser) -> None:
    from stepscope.measure.attention.presets import PRESETS

    def default(name: str) -> str | None:
        return config_default(AttentionBenchConfig, name)

    grids = "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items())
    parser.add_argument("--grid", default=None, help=f"preset sweep ({grids})")
    parser.add_argument("--impl", default=None,
                        help=f"comma list of naive,sdpa,compiled,flash-torch,flash-triton (default {default('impls')})")
    sizes = parser.add_argument_group("problem (comma lists sweep)")
    sizes.add_argument("--batch", default=None, help=f"batch sizes (default {default('batch')})")
    sizes.add_argument("--heads", default=None, help=f"heads (default {default('heads')})")
    sizes.add_argument("--seq", default=None, help=f"sequence lengths (default {default('seq')})")
    sizes.add_argument("--dim", default=None, help=f"head dimensions (default {default('dim')})")
    sizes.add_argument("--precision", default=None, help=f"fp32, bf16, fp16 (default {default('dtype')})")
    add_alias(sizes, "--dtype", "--precision")
    causal = "on" if field_default(AttentionBenchConfig, "causal")[0] else "off"
    sizes.add_argument("--causal", default=None, action=argparse.BooleanOptionalAction,
                       help=f"causal mask, top-left aligned (default: {causal})")
    sizes.add_argument("--mode", dest="passes", default=None,
                       help=f"the passes timed: fwd, bwd, fwd-bwd (default {default('passes')})")
    add_alias(sizes, "--pass", "--mode")
    measurement = parser.add_argument_group("measurement")
    add_device_option(measurement, AttentionBenchConfig)
    measurement.add_argument("--warmup", default=None,
                             help=f"untimed rounds after the check and memory runs (default {default('warmup')})")
    measurement.add_argument("--iters", default=None, help=f"timed rounds (default {default('iters')})")
    measurement.add_argument("--threads", default=None, help="CPU intra-op threads (default: PyTorch's choice)")
    measurement.add_argument("--check-rows", default=None,
                             help=f"query rows checked against fp64 at long sequences ({default('check_rows')})")
    add_seed_option(measurement, AttentionBenchConfig, help="seed of q, k, v and dO")
    measurement.add_argument("--startup-s", default=None, help="seconds of warm-up on a tiny problem before the "
                             f"first point (default {default('startup_s')})")
    add_alias(measurement, "--startup", "--startup-s")
    add_plot_options(parser, "attention-<grid|sweep>.png, written when more than one --seq is swept")
    add_output_options(parser)


def bench_config(args: argparse.Namespace) -> AttentionBenchConfig:
    """The AttentionBenchConfig from the preset (if any) and the options given (types checked here, the rest
    by `validate`)."""
    from stepscope.measure.attention.presets import preset_fields
    from stepscope.measure.device import resolve_device
    from stepscope.nn.attention import attention_backends
    from stepscope.nn.attention_reference import PASSES

    device = resolve_device(args.device)
    fields = preset_fields(args.grid, device.type) if args.grid else {}
    lists = {"impls": ("--impl", args.impl, choice(*attention_backends())),
             "batch": ("--batch", args.batch, positive_int), "heads": ("--heads", args.heads, positive_int),
             "seq": ("--seq", args.seq, positive_int), "dim": ("--dim", args.dim, positive_int),
             "dtype": ("--precision", args.precision, choice(*TOLERANCE)),
             "passes": ("--mode", args.passes, choice(*PASSES))}
    for name, (option, text, convert) in lists.items():
        if text is not None:
            fields[name] = tuple(dict.fromkeys(parse_list(text, convert, option)))
    if args.causal is not None:
        fields["causal"] = (args.causal,)
    for name, option, text, convert in (("warmup", "--warmup", args.warmup, non_negative_int),
                                        ("iters", "--iters", args.iters, positive_int),
                                        ("threads", "--threads", args.threads, positive_int),
                                        ("check_rows", "--check-rows", args.check_rows, positive_int),
                                        ("startup_s", "--startup-s", args.startup_s, non_negative_float)):
        if text is not None:
            fields[name] = one_value(text, convert, option)
    return AttentionBenchConfig(device=args.device, seed=args.seed, **fields)


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


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.attention.benchmark import run_attention_sweep

    config = bench_config(args)
    plot = None
    if not args.no_plot and (len(config.seq) > 1 or args.plot):
        plot = args.plot or Path(args.out) / f"attention-{config.grid or 'sweep'}.png"
    printer = Printer(args.format)

    def show(point, records) -> None:
        rows = point_rows(records, config.passes, args.format)
        every = list(dict.fromkeys([c for row in rows for c in row] + ["note"]))
        if args.format == "table":  # a table per point: only the columns this point has values for
            columns = [c for c in every if any(r.get(c) is not None for r in rows)]
        else:  # one CSV header / JSON shape for the whole sweep
            columns = every
        printer.emit(rows, title=point.label() + f" (threads {records[0]['env'].get('threads')})", columns=columns)

    outcome = run_attention_sweep(config, args.out, resume=args.resume, plot=plot, on_point=show)
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} record(s) already in {args.out}/attention.jsonl (--resume)")
    printer.note(f"records: {args.out}/attention.jsonl")
    if outcome.plot is not None:
        printer.note(f"plot: {outcome.plot}")
    return 0
