"""`stepscope predict`: one parallel plan -> step time, tokens/s, MFU, memory and the per-phase breakdown.

Also owns the options shared by the performance-model commands (system, workload, plan switches).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from stepscope.cli.options import add_output_options, choice, parse_list, positive_int
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.errors import UsageError
from stepscope.spec import MODES, PRECISIONS

T = TypeVar("T")
YES_NO = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}


def add_system_option(parser: argparse.ArgumentParser, default: str = "A100-80GB") -> None:
    parser.add_argument("--system", default=default, help=f"system preset or TOML file (default {default}); "
                        "presets: A100-80GB, H100-SXM, H200, B200, MI300X, CPU")


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """Workload of a (distributed) step and the execution switches every plan shares."""
    group = parser.add_argument_group("workload")
    group.add_argument("--gpus", default=None, help="total GPUs (default: the product of the plan)")
    group.add_argument("--global-batch", default=None,
                       help="sequences per step over all replicas (predict default: dp x micro-batch)")
    group.add_argument("--seq", default=None, help="tokens per sequence (default: the model's context_length)")
    group.add_argument("--precision", default="bf16", help=f"{'|'.join(PRECISIONS)} (default bf16)")
    group.add_argument("--mode", default="train", help=f"{'|'.join(MODES)} (default train)")
    group = parser.add_argument_group("execution switches")
    group.add_argument("--dropout", action="store_true", help="the run applies dropout (masks kept for backward)")
    group.add_argument("--fp32-grads", action="store_true", help="gradients accumulated and reduced in fp32")
    group.add_argument("--no-dp-overlap", action="store_true", help="gradient reduction after backward, not during")
    group.add_argument("--tp-overlap", action="store_true", help="TP/CP collectives overlap their GEMMs")


def one_value(text: str, convert: Callable[[str], T], option: str) -> T:
    """Exactly one value from the command line (a comma list is a usage error here)."""
    values = parse_list(str(text), convert, option)
    if len(values) != 1:
        raise UsageError(f"{option} takes one value here, got {text!r}")
    return values[0]


def one_int(text: str | None, option: str, default: int | None = None) -> int | None:
    """One positive integer from the command line (or `default` when the option was not given)."""
    return default if text is None else one_value(text, positive_int, option)


def yes_no(text: str, option: str) -> bool:
    if text.lower() not in YES_NO:
        raise UsageError(f"invalid value {text!r} for {option} (choose yes or no)")
    return YES_NO[text.lower()]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("predict", help="predict a training step of one parallel plan",
                                   description="Predict step time, throughput, MFU and memory of one plan on a "
                                               "system, with the breakdown by cause. Comma lists of models sweep.")
    add_model_options(parser)
    add_system_option(parser)
    add_training_options(parser)
    group = parser.add_argument_group("plan")
    for name, help_text in (("dp", "data-parallel replicas (default: GPUs / (tp*pp*cp))"), ("tp", "tensor parallel"),
                            ("pp", "pipeline stages"), ("cp", "context parallel"),
                            ("interleave", "virtual pipeline chunks per stage"),
                            ("micro-batch", "sequences per micro-batch")):
        group.add_argument(f"--{name}", default=None, help=help_text)
    group.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    group.add_argument("--zero", default="0", help="ZeRO stage 0-3 (1 = distributed optimizer)")
    group.add_argument("--recompute", default="none", help="none|selective|full")
    group.add_argument("--flash", default="yes", help="fused flash attention: yes|no (default yes)")
    group.add_argument("--placement", default="tp,cp,dp,pp", help="nesting of the groups on ranks, innermost first")
    group.add_argument("--bucket-MiB", default="25", help="gradient bucket size for the overlap rule (default 25)")
    group.add_argument("--buckets", default="size",
                       help="gradient bucket layout: size (size-based estimate), or torch|strict (the DDP bucket "
                            "planner's layout of this model's gradients, stepscope.spec.buckets)")
    parser.add_argument("--per-layer", action="store_true", help="also print the per-op table of one layer")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run)


def plan_from_args(args: argparse.Namespace, spec) -> tuple[Any, Any]:
    """(ParallelPlan, Workload) from the command line, validated against `spec`."""
    from stepscope.spec import Workload
    from stepscope.spec.plan import RECOMPUTE, ParallelPlan

    tp, pp, cp = (one_int(getattr(args, k), f"--{k}", 1) for k in ("tp", "pp", "cp"))
    gpus = one_int(args.gpus, "--gpus")
    dp = one_int(args.dp, "--dp")
    if dp is None:
        if gpus is not None and gpus % (tp * pp * cp):
            raise UsageError(f"tp*pp*cp = {tp * pp * cp} does not divide --gpus {gpus}")
        dp = gpus // (tp * pp * cp) if gpus is not None else 1
    micro_batch = one_int(args.micro_batch, "--micro-batch", 1)
    zero = one_value(args.zero, int, "--zero")
    recompute = choice(*RECOMPUTE)(args.recompute)
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=micro_batch, zero=zero, recompute=recompute,
                        interleave=one_int(args.interleave, "--interleave", 1),
                        sequence_parallel=args.sequence_parallel, flash_attention=yes_no(args.flash, "--flash"),
                        dropout=args.dropout, fp32_grads=args.fp32_grads, dp_overlap=not args.no_dp_overlap,
                        tp_overlap=args.tp_overlap, placement=tuple(parse_list(args.placement, str, "--placement")))
    batch = one_int(args.global_batch, "--global-batch", dp * micro_batch)
    seq = one_int(args.seq, "--seq", spec.context_length)
    workload = Workload(batch=batch, seq=seq, precision=choice(*PRECISIONS)(args.precision),
                        mode=choice(*MODES)(args.mode))
    workload.check_fits(spec.context_length)
    plan.check(spec, batch, seq, gpus)
    return plan, workload


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel import evaluate
    from stepscope.perfmodel.layers import per_layer_rows
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.spec.system import load_system

    system = load_system(args.system)
    specs = model_specs(args)
    bucket = one_value(args.bucket_MiB, float, "--bucket-MiB")
    if not bucket > 0:
        raise UsageError(f"--bucket-MiB must be positive, got {args.bucket_MiB}")
    bucket_rule = choice("size", "torch", "strict")(args.buckets)
    jobs = [(spec, *plan_from_args(args, spec)) for spec in specs]
    for _, plan, workload in jobs:  # every precision must exist on the system before any output
        system.accelerator.matrix_peak(workload.precision)
    store = RecordStore(args.out, "predict").check_writable()
    printer = Printer(args.format)
    for spec, plan, workload in jobs:
        layout = None
        if bucket_rule != "size":  # the planner is pure Python; the model only receives bucket sizes
            from stepscope.perfmodel.evaluate import gradient_tensors
            from stepscope.spec.buckets import bucket_numels, plan_buckets

            layout = bucket_numels(plan_buckets(gradient_tensors(spec, workload, plan), cap_mb=bucket,
                                                rule=bucket_rule))
        p = evaluate(spec, workload, plan, system, bucket_cap_MiB=bucket, bucket_elements=layout)
        title = (f"{spec.name} on {plan.gpus} x {system.name}: {plan.describe()}, global batch {workload.batch}, "
                 f"seq {workload.seq}, {workload.precision} {workload.mode}")
        totals = {"step_s": p.step_s, "tokens_per_s": p.tokens_per_s, "mfu_pct": p.mfu_pct, "hfu_pct": p.hfu_pct,
                  "tflops_per_gpu": p.model_flops / p.step_s / plan.gpus / 1e12, "micro_batches": p.micro_batches,
                  "mem_GiB": p.memory.total / 2**30, "capacity_GiB": p.memory.capacity / 2**30,
                  "fits": p.memory.feasible}
        printer.note(title)  # a line of its own: a table title would wrap at the table's width
        printer.emit([totals])
        printer.emit([{"cause": cause, "seconds": s, "share_pct": 100 * s / p.step_s}
                      for cause, s in p.breakdown.items() if s > 0], title="where the step goes")
        printer.emit([{"part": k.removesuffix("_GiB"), "GiB": v} for k, v in p.memory.GiB().items()
                      if k not in ("mem_GiB",)], title="memory per GPU")
        if args.per_layer:
            printer.emit(per_layer_rows(spec, workload, plan, system),
                         title="per layer: one GPU, one micro-batch; blocks summed over a stage's layers")
        config = {"model": spec.name, "model_spec": spec.to_dict(), **workload.to_dict(), "plan": plan.to_dict(),
                  "system": system.name, "gpus": plan.gpus, "bucket_MiB": bucket, "buckets": bucket_rule}
        store.append(make_record("predict", config, p.metrics(), env=base_environment()))
    printer.note(f"records: {store.path}")
    return 0
