"""`stepscope step`: benchmark a training step per phase; comma lists sweep (one record per point).
The work and the records: `stepscope.measure.step` (`run_step_sweep`, `run_step_ab` for `--ab`) and
`stepscope.measure.moe` (`run_moe_vs_dense` for `--vs-dense`)."""

from __future__ import annotations

import argparse

from stepscope.cli.options import (
    add_output_options,
    config_default,
    non_negative_int,
    parse_list,
    positive_int,
)
from stepscope.cli.options.model import add_step_options, step_configs
from stepscope.measure.step.config import StepConfig

NAME = "step"
HELP = "benchmark a training step (forward, backward, optimizer)"
DESCRIPTION = "Time a training step phase by phase. Comma lists sweep."


SUMMARY_COLUMNS = ["model", "batch", "seq", "mode", "precision", "attention", "moe_impl", "warmup", "threads", "status",
                   "step_ms_median", "step_tokens_per_s", "step_TFLOPps", "step_gemm_fraction", "step_mfu_pct"]


def add_options(parser: argparse.ArgumentParser) -> None:
    add_step_options(parser)
    parser.add_argument("--warmup", default=config_default(StepConfig, "warmup"),
                        help="untimed steps before timing (comma list sweeps; default %(default)s)")
    parser.add_argument("--iters", default=config_default(StepConfig, "iters"),
                        help="timed steps (default %(default)s)")
    parser.add_argument("--ab", action="store_true",
                        help="compare exactly two setups (e.g. --attention naive,sdpa) side by side: whole steps of "
                             "A and B alternate, and the median per-pair time ratio is the answer")
    parser.add_argument("--vs-dense", action="store_true",
                        help="an MoE model's step beside the dense model of equal activated FLOPs (MLP width "
                             "(k + shared) x expert_d_ff), and one MoE block against its reference and that dense "
                             "MLP, piece by piece (router, permute, experts, combine), in one interleaved run")
    add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer, effective_threads, model_label, overridden_fields, summary_columns
    from stepscope.measure.step.benchmark import PHASE_COLUMNS, run_step_sweep
    from stepscope.results.views import record_row

    configs = step_configs(args, parse_list(args.warmup, non_negative_int, "--warmup"),
                           parse_list(args.iters, positive_int, "--iters"))
    if args.ab and args.vs_dense:
        from stepscope.errors import UsageError

        raise UsageError("--ab and --vs-dense are two different comparisons: give one")
    if args.ab:
        return run_ab(args, configs)
    if args.vs_dense:
        return run_vs_dense(args, configs)
    printer = Printer(args.format)
    several_warmups = len({config.warmup for config in configs}) > 1

    def show(record, config, result) -> None:
        if args.format in ("csv", "json"):  # one row shape for every point, oom rows included (one CSV header)
            identity = {"model": config.model.name, **overridden_fields(config.model), **config.workload.to_dict(),
                        "attention": config.attention,
                        "moe_impl": config.moe_impl if config.model.is_moe else None,
                        "warmup": config.warmup, "threads": effective_threads(record), "status": record["status"]}
            rows = [{**identity, **row} for row in result.rows()] if result is not None else [
                {**identity, "note": record.get("note")}]
            printer.emit(rows, columns=[*identity, *PHASE_COLUMNS, "note"])
            return
        point = f"{model_label(config.model)} batch {config.workload.batch} seq {config.workload.seq} " \
                f"{config.workload.mode} {config.workload.precision} {config.attention}" \
                + (f" experts {config.moe_impl}" if config.model.is_moe else "") \
                + (f" warmup {config.warmup}" if several_warmups else "")
        if result is None:
            printer.emit([{"point": point, "status": record["status"], "note": record.get("note")}])
            return
        extra = f", compile {result.compile_s:.1f} s" if result.compile_s is not None else ""
        rows = result.rows()
        # mean, min and max stay in the records and in csv/json: the median and p10-p90 tell the time and its
        # spread, and the table fits 100 columns
        shown = [c for c in PHASE_COLUMNS if c not in ("mean_ms", "min_ms", "max_ms") and any(c in row for row in rows)]
        printer.emit(rows, title=f"{point} ({result.device}, {result.threads} threads{extra})", columns=shown)

    outcome = run_step_sweep(configs, args.out, resume=args.resume, on_record=show)
    if len(outcome.records) > 1 and args.format in ("table", "md"):
        rows = [{**record_row(r), "threads": effective_threads(r)} for r in outcome.records]
        printer.emit(rows, title="sweep summary", columns=summary_columns(rows, SUMMARY_COLUMNS))
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {args.out}/step.jsonl (--resume)")
    printer.note(f"records: {args.out}/step.jsonl")
    return 0


def run_ab(args: argparse.Namespace, configs: list[StepConfig]) -> int:
    """`--ab`: one record (kind step-ab) with both setups, their step times and the per-pair ratios."""
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.step.ab import check_pair, describe, run_step_ab

    if args.resume:
        raise UsageError("--resume does not apply to --ab (one measurement of two setups)")
    printer = Printer(args.format)
    outcome = run_step_ab(configs, args.out)
    a, b = check_pair(configs)
    result = outcome.result
    if result is None:
        printer.emit([{"A": describe(a, b), "B": describe(b, a), "status": outcome.record["status"]}])
    else:
        printer.emit(result.rows(), title=f"A/B: {a.model.name} batch {a.workload.batch} seq {a.workload.seq} "
                                          f"{a.workload.mode} {a.workload.precision}, whole steps interleaved "
                                          f"(A B, B A, ...) after {a.warmup} warm-up pair(s) "
                                          f"({result.device}, {result.threads} threads)")
        printer.note(result.verdict())
    printer.note(f"records: {args.out}/step-ab.jsonl")
    return 0


def run_vs_dense(args: argparse.Namespace, configs: list[StepConfig]) -> int:
    """`--vs-dense`: one record (kind moe-vs-dense), two tables (the steps; the block and its pieces)."""
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.moe.benchmark import run_moe_vs_dense
    from stepscope.measure.moe.config import MoEDenseConfig

    if args.resume:
        raise UsageError("--resume does not apply to --vs-dense (one measurement of two models)")
    if len(configs) != 1:
        raise UsageError(f"--vs-dense measures one MoE setup; these options make {len(configs)}")
    printer = Printer(args.format)
    record, result = run_moe_vs_dense(MoEDenseConfig(step=configs[0]), args.out)
    if result is None:
        printer.emit([{"status": record["status"], "note": record.get("note")}])
    else:
        for table in result.tables():
            printer.emit(table.rows, title=table.title)
        printer.note(result.rates_line())
        printer.note(result.verdict())
    printer.note(f"records: {args.out}/moe-vs-dense.jsonl")
    return 1 if record["status"] == "mismatch" else 0
