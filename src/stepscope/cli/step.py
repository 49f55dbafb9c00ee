"""`stepscope step`: benchmark a training step per phase; comma lists sweep (one record per point)."""

from __future__ import annotations

import argparse
import itertools

from stepscope.cli.options import (add_model_options, add_output_options, add_threads_option, choice,
                                   model_specs, non_negative_int, parse_list, positive_int, threads_list)
from stepscope.spec import MODES, PRECISIONS

SUMMARY_COLUMNS = ["model", "batch", "seq", "mode", "precision", "attention", "warmup", "threads", "status",
                   "step_ms_median", "step_tokens_per_s", "step_GFLOPps", "step_gemm_fraction", "step_mfu_pct"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("step", help="benchmark a training step (forward, backward, optimizer)",
                                   description="Time a training step phase by phase. Comma lists sweep.")
    add_model_options(parser)
    add_workload_options(parser)
    parser.add_argument("--warmup", default="5", help="untimed steps before timing (comma list sweeps)")
    parser.add_argument("--iters", default="10", help="timed steps")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    add_threads_option(parser)
    parser.add_argument("--ab", action="store_true",
                        help="compare exactly two setups (e.g. --attention naive,sdpa) side by side: whole steps of "
                             "A and B alternate, and the median per-pair time ratio is the answer")
    add_output_options(parser)
    parser.set_defaults(func=run)


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """Workload and execution options shared by step, profile and memory."""
    group = parser.add_argument_group("workload (comma lists sweep)")
    group.add_argument("--batch", default="4", help="sequences per step (default 4)")
    group.add_argument("--seq", default="128", help="tokens per sequence (default 128)")
    group.add_argument("--mode", default="train", help=f"{'|'.join(MODES)} (default train)")
    group.add_argument("--precision", default="fp32", help=f"{'|'.join(PRECISIONS)} (default fp32)")
    group.add_argument("--attention", default="sdpa", help="attention backend: naive|sdpa|flash-torch|flash-triton")
    group.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported apart)")
    group.add_argument("--device", default="auto", help="auto|cpu|cuda (default auto)")


def workload_grid(args: argparse.Namespace) -> list[tuple]:
    """(spec, workload, attention) for every combination of the listed values, validated."""
    from stepscope.spec import Workload

    specs = model_specs(args)
    batches = parse_list(args.batch, positive_int, "--batch")
    seqs = parse_list(args.seq, positive_int, "--seq")
    modes = parse_list(args.mode, choice(*MODES), "--mode")
    precisions = parse_list(args.precision, choice(*PRECISIONS), "--precision")
    attentions = parse_list(args.attention, str, "--attention")
    grid = []
    for spec, batch, seq, mode, precision, attention in itertools.product(specs, batches, seqs, modes,
                                                                           precisions, attentions):
        grid.append((spec, Workload(batch=batch, seq=seq, precision=precision, mode=mode), attention))
    return grid


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.measure.step.benchmark import PHASE_COLUMNS, StepConfig, run_step_sweep
    from stepscope.results.tables import effective_threads
    from stepscope.results.store import RecordStore

    warmups = parse_list(args.warmup, non_negative_int, "--warmup")
    iters = parse_list(args.iters, positive_int, "--iters")
    configs = [StepConfig(model=spec, workload=workload, attention=attention, device=args.device,
                          compile=args.compile, warmup=warmup, iters=n, threads=threads, seed=args.seed)
               for (spec, workload, attention), warmup, n, threads
               in itertools.product(workload_grid(args), warmups, iters, threads_list(args))]
    for config in configs:
        config.validate()
    if args.ab:
        return run_ab(args, configs)
    store = RecordStore(args.out, "step").check_writable()
    printer = Printer(args.format)

    def show(record, config, result) -> None:
        if args.format in ("csv", "json"):  # one row shape for every point, oom rows included (one CSV header)
            identity = {"model": config.model.name, **config.workload.to_dict(), "attention": config.attention,
                        "warmup": config.warmup, "threads": effective_threads(record), "status": record["status"]}
            rows = [{**identity, **row} for row in result.rows()] if result is not None else [
                {**identity, "note": record.get("note")}]
            printer.emit(rows, columns=[*identity, *PHASE_COLUMNS, "note"])
            return
        point = f"{config.model.name} batch {config.workload.batch} seq {config.workload.seq} " \
                f"{config.workload.mode} {config.workload.precision} {config.attention}" \
                + (f" warmup {config.warmup}" if len(warmups) > 1 else "")
        if result is None:
            printer.emit([{"point": point, "status": record["status"], "note": record.get("note")}])
            return
        extra = f", compile {result.compile_s:.1f} s" if result.compile_s is not None else ""
        printer.emit(result.rows(), title=f"{point} ({result.device}, {result.threads} threads{extra})")

    outcome = run_step_sweep(configs, store, resume=args.resume, on_record=show)
    if len(outcome.records) > 1 and args.format in ("table", "md"):
        from stepscope.results.views import record_row

        rows = [record_row(r) for r in outcome.records]
        printer.emit(rows, title="sweep summary", columns=[c for c in SUMMARY_COLUMNS if any(c in r for r in rows)])
    if outcome.skipped:
        printer.note(f"skipped {outcome.skipped} point(s) already in {store.path} (--resume)")
    printer.note(f"records: {store.path}")
    return 0


def run_ab(args: argparse.Namespace, configs: list) -> int:
    """`--ab`: one record (kind step-ab) with both setups, their step times and the per-pair ratios."""
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.measure.device import is_out_of_memory, release_memory, resolve_device
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.step.ab import benchmark_ab, check_pair, describe
    from stepscope.results.store import RecordStore, make_record

    a, b = check_pair(configs)
    if args.resume:
        raise UsageError("--resume does not apply to --ab (one measurement of two setups)")
    store = RecordStore(args.out, "step-ab").check_writable()
    printer = Printer(args.format)
    device = resolve_device(a.device)
    env = torch_environment(device, threads=a.threads)
    config = {"a": a.record_config(), "b": b.record_config()}
    try:
        result = benchmark_ab(a, b)
    except Exception as error:  # an out-of-memory is a result (a row), anything else a bug
        if not is_out_of_memory(error):
            raise
        release_memory(device)
        store.append(make_record("step-ab", config, status="oom", env=env, note=str(error).splitlines()[0]))
        printer.emit([{"A": describe(a, b), "B": describe(b, a), "status": "oom"}])
        printer.note(f"records: {store.path}")
        return 0
    store.append(make_record("step-ab", result.record_config(), result.metrics(), env=env))
    printer.emit(result.rows(), title=f"A/B: {a.model.name} batch {a.workload.batch} seq {a.workload.seq} "
                                      f"{a.workload.mode} {a.workload.precision}, whole steps interleaved "
                                      f"(A B, B A, ...) after {a.warmup} warm-up pair(s) "
                                      f"({result.device}, {result.threads} threads)")
    printer.note(result.verdict())
    printer.note(f"records: {store.path}")
    return 0
