"""`stepscope ddp`: data-parallel variants side by side (ours and PyTorch's DDP), bucket-size sweep, memory
with and without optimizer-state sharding, analytic b*. Parsing and printing only: the work is
`stepscope.distributed.data_parallel.benchmark.run_ddp_benchmark`, once per (model, batch, seq, threads) point."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from pathlib import Path
from typing import Any

from stepscope.cli.options import add_output_options, choice, non_negative_int, parse_list, positive_float, positive_int
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.distributed.launch.ranks import MAX_RANKS_PER_CORE, OVERSUBSCRIBE_ENV
from stepscope.errors import UsageError
from stepscope.spec import PRECISIONS

VARIANT_NAMES = ("naive", "flat", "individual", "bucketed", "torch")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ddp", help="data-parallel variants vs PyTorch DDP: overlap, bucket sizes, sharded optimizer memory",
        description="Train on local ranks (or under torchrun) with every data-parallel variant interleaved in "
                    "one run: step time, compute-only step, exposed communication and overlap, buckets, memory "
                    "per rank with and without optimizer-state sharding, and the analytic bucket size "
                    "b* = sqrt(s*w*alpha) from measured all-reduce costs. Comma lists sweep.")
    add_model_options(parser, default="small")
    group = parser.add_argument_group("workload and variants")
    group.add_argument("--batch", default="2", help="GLOBAL batch in sequences, split across ranks (default 2)")
    group.add_argument("--seq", default="128", help="tokens per sequence (default 128)")
    group.add_argument("--world", default="2", help="ranks to spawn (default 2; torchrun sets its own)")
    group.add_argument("--precision", default="fp32", help=f"{'|'.join(PRECISIONS)} (default fp32)")
    group.add_argument("--variants", default=",".join(VARIANT_NAMES),
                       help=f"which to run (default {','.join(VARIANT_NAMES)}); torch = "
                            "torch.nn.parallel.DistributedDataParallel with the same caps")
    group.add_argument("--bucket-mb", default="1,10,100",
                       help="bucket caps in MiB for bucketed and torch; 'none' = one bucket (default 1,10,100)")
    group.add_argument("--bucket-rule", default="strict", help="strict|torch: how DDPBucketed fills buckets")
    group.add_argument("--shard-optimizer", action="store_true",
                       help="time steps with ShardedOptimizer(AdamW) (memory is shown for both)")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--warmup", default="1", help="untimed rounds after the correctness check (default 1)")
    timing.add_argument("--iters", default="5", help="timed rounds, every variant once per round (default 5)")
    timing.add_argument("--comm-iters", default="3", help="repetitions of communication-only timings (default 3)")
    timing.add_argument("--threads", default=None, help="intra-op threads per rank (comma list sweeps; "
                        "default cores / ranks)")
    timing.add_argument("--backend", default="auto", help="auto|gloo|nccl (default auto)")
    timing.add_argument("--seed", default="0", help="seed for weights (+rank) and data")
    timing.add_argument("--timeout", default="600", help="seconds a rank may wait on a peer (default 600)")
    timing.add_argument("--oversubscribe", action="store_true", help="start more local ranks than the limit of "
                        f"{MAX_RANKS_PER_CORE} per CPU core (ranks started by torchrun/srun are not limited)")
    plot = parser.add_argument_group("plot")
    plot.add_argument("--plot", default=None, help="PNG path (default <out>/ddp.png)")
    plot.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    add_output_options(parser)
    parser.set_defaults(func=run)


def _cap(text: str) -> float | None:
    if text.lower() in ("none", "one"):
        return None
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value




def _single(text: str, convert: Any, option: str) -> Any:
    values = parse_list(text, convert, option)
    if len(values) != 1:
        raise UsageError(f"{option} takes one value, got {text!r}")
    return values[0]


def build_configs(args: argparse.Namespace) -> list[Any]:
    """Every benchmark point of the command line, validated (UsageError on any bad value)."""
    from stepscope.distributed.data_parallel.benchmark import DDPBenchConfig
    from stepscope.distributed.launch.launcher import external_launch_env
    from stepscope.distributed.launch.ranks import check_local_world

    specs = model_specs(args)
    world = _single(args.world, positive_int, "--world")
    external = external_launch_env()  # under torchrun/Slurm its world size is the real one (records, batch split)
    if external is None:  # before the batch split: too many ranks is the first thing to say
        check_local_world(world, oversubscribe=args.oversubscribe)
    batches = parse_list(args.batch, positive_int, "--batch")
    seqs = parse_list(args.seq, positive_int, "--seq")
    threads = [None] if args.threads is None else parse_list(args.threads, positive_int, "--threads")
    common = dict(
        world=external["world_size"] if external else world,
        precision=_single(args.precision, choice(*PRECISIONS), "--precision"),
        variants=tuple(dict.fromkeys(parse_list(args.variants, choice(*VARIANT_NAMES), "--variants"))),
        bucket_mb=tuple(dict.fromkeys(parse_list(args.bucket_mb, _cap, "--bucket-mb"))),
        bucket_rule=_single(args.bucket_rule, choice("strict", "torch"), "--bucket-rule"),
        shard_optimizer=args.shard_optimizer,
        warmup=_single(args.warmup, non_negative_int, "--warmup"),
        iters=_single(args.iters, positive_int, "--iters"),
        comm_iters=_single(args.comm_iters, positive_int, "--comm-iters"),
        backend=_single(args.backend, choice("auto", "gloo", "nccl"), "--backend"),
        seed=_single(args.seed, non_negative_int, "--seed"),
        timeout_s=_single(args.timeout, positive_float, "--timeout"))
    configs = [DDPBenchConfig(model=spec, batch=batch, seq=seq, threads=thread, **common)
               for spec, batch, seq, thread in itertools.product(specs, batches, seqs, threads)]
    for config in configs:
        config.validate()
    return configs


def _check_environment(config: Any) -> None:
    """Backend and precision must work here before any rank is spawned."""
    import torch

    from stepscope.distributed.launch.launcher import external_launch_env, resolve_backend
    from stepscope.measure.device import check_precision

    external = external_launch_env()
    backend = resolve_backend(config.backend, external["local_world_size"] if external else config.world)
    check_precision(torch.device("cuda" if backend == "nccl" else "cpu"), config.precision)


def _plot_path(args: argparse.Namespace) -> Path | None:
    if args.no_plot:
        return None
    path = Path(args.plot) if args.plot else Path(args.out) / "ddp.png"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot write the plot to {path}: {error.strerror or error}") from None
    if path.is_dir():
        raise UsageError(f"--plot {path} is a folder; give a .png file path")
    return path


@contextlib.contextmanager
def _oversubscribed(enabled: bool) -> Any:
    """--oversubscribe for the launcher, which reads STEPSCOPE_OVERSUBSCRIBE (DDPBenchConfig has no such
    field); set only meanwhile, so a caller in this process is not left oversubscribing."""
    previous = os.environ.get(OVERSUBSCRIBE_ENV)
    if enabled:
        os.environ[OVERSUBSCRIBE_ENV] = "1"
    try:
        yield
    finally:
        if enabled:
            if previous is None:
                os.environ.pop(OVERSUBSCRIBE_ENV, None)
            else:
                os.environ[OVERSUBSCRIBE_ENV] = previous


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.distributed.launch.launcher import external_launch_env
    from stepscope.results.store import RecordStore, make_record

    configs = build_configs(args)
    _check_environment(configs[0])
    store = RecordStore(args.out, "ddp").check_writable()
    plot_path = _plot_path(args)
    external = external_launch_env()
    reporting = external is None or external["rank"] == 0
    printer = Printer(args.format)
    done = store.done_keys() if args.resume else set()

    from stepscope.distributed.data_parallel.benchmark import run_ddp_benchmark
    from stepscope.distributed.data_parallel.plot import plot_bucket_sweep
    from stepscope.measure.environment import torch_environment

    results, skipped = [], 0
    for config in configs:
        keys = {make_record("ddp", config.record_config(v, cap))["key"] for v, cap in
                [("compute", None), *config.points()]}
        if keys <= done:
            skipped += 1
            continue
        with _oversubscribed(args.oversubscribe):
            result = run_ddp_benchmark(config)
        if result is None or not reporting:
            continue
        env = torch_environment(result.device, result.world_size)
        for record in result.records(env):
            store.append(record)
        _show(printer, args.format, config, result)
        results.append(result)
        if plot_path is not None:
            plot_bucket_sweep(results, plot_path)
    if not reporting:
        return 0
    if skipped:
        printer.note(f"skipped {skipped} point(s) already in {store.path} (--resume)")
    if plot_path is not None and results:
        printer.note(f"plot: {plot_path}")
    printer.note(f"records: {store.path}")
    wrong = [v.label for result in results for v in result.variants if not v.ok]
    if wrong:  # like `stepscope comm`: timings of a variant that computes wrong gradients are no success
        print(f"stepscope: averaged gradients differ from the reference for {', '.join(wrong)} (see check)",
              file=sys.stderr)
        return 1
    return 0


def _show(printer: Any, fmt: str, config: Any, result: Any) -> None:
    from stepscope.distributed.data_parallel.benchmark import model_label

    title = (f"{model_label(config.model)} global batch {config.batch} seq {config.seq} {config.precision}, "
             f"{result.world_size} ranks x {result.threads} thread(s), {result.backend} on {result.device}"
             f"{', ShardedOptimizer(AdamW)' if config.shard_optimizer else ', AdamW'}")
    rows = result.rows()
    if fmt in ("table", "md"):
        printer.emit(rows, title=title + " (ms: slowest rank per round; vs_torch: median per-round ratio)")
        printer.emit(result.memory_rows(), title="memory per rank over a first step of the bare model (rank 0; "
                                                 "each variant's gradient memory once synchronized, buckets "
                                                 "included, is its grads_MiB above)")
    else:
        point = {"model": model_label(config.model), "batch": config.batch, "seq": config.seq,
                 "precision": config.precision, "world": result.world_size, "threads": result.threads}
        printer.emit([{**point, **row} for row in rows])
    for line in result.summary_lines():
        printer.note(line)
