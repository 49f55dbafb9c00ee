"""`stepscope plan`: search every valid parallel plan, keep the feasible ones, print the best by throughput."""

from __future__ import annotations

import argparse
import sys

from stepscope.cli.options import add_output_options, choice, parse_list, positive_int
from stepscope.cli.options.model import add_model_options, model_specs
from stepscope.cli.predict import add_system_option, add_training_options, one_int, yes_no
from stepscope.errors import UsageError
from stepscope.spec import MODES, PRECISIONS

PROGRESS_ABOVE = 2_000_000  # candidates: smaller searches finish before a bar would be useful


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="search parallel plans and rank the feasible ones",
                                   description="Enumerate every valid (tp, pp, dp, cp, micro-batch, ZeRO stage, "
                                               "recompute, interleave, placement) for a model on N GPUs, evaluate "
                                               "them vectorized, and print the fastest plans that fit in memory.")
    add_model_options(parser, default="gpt3-175b")
    add_system_option(parser)
    add_training_options(parser)
    group = parser.add_argument_group("search space (comma lists; default: every value that can be valid)")
    for name, default in (("tp", "divisors of --gpus"), ("pp", "divisors of --gpus"), ("cp", "divisors of --gpus"),
                          ("micro-batch", "divisors of --global-batch"), ("interleave", "1,2,3,4,6,8")):
        group.add_argument(f"--{name}", default=None, help=f"{name} values to try (default {default})")
    group.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to try (default 0,1,2,3)")
    group.add_argument("--recompute", default="none,selective,full", help="recompute modes to try")
    group.add_argument("--sequence-parallel", default="no,yes", help="sequence parallelism: no,yes (default both)")
    group.add_argument("--flash", default="yes", help="fused flash attention: yes, no, or no,yes (default yes)")
    group.add_argument("--no-placements", action="store_true",
                       help="only Megatron's rank order (tp, cp, dp, pp) instead of every placement")
    parser.add_argument("--top", default="10", help="how many plans to print (default 10)")
    parser.add_argument("--explain", action="store_true", help="print how many candidates each rule rejected")
    parser.add_argument("--threads", default="1", help="evaluation threads (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_output_options(parser, resume=False)
    parser.set_defaults(func=run)


def _space(args: argparse.Namespace):
    from stepscope.perfmodel.search import SearchSpace
    from stepscope.spec.plan import RECOMPUTE

    def ints(option: str, text: str | None):
        return None if text is None else tuple(parse_list(text, positive_int, option))

    zero = tuple(parse_list(args.zero, int, "--zero"))
    if any(z not in (0, 1, 2, 3) for z in zero):
        raise UsageError(f"--zero values must be 0, 1, 2 or 3, got {args.zero}")
    return SearchSpace(tp=ints("--tp", args.tp), pp=ints("--pp", args.pp), cp=ints("--cp", args.cp),
                       micro_batch=ints("--micro-batch", args.micro_batch),
                       interleave=ints("--interleave", args.interleave) or SearchSpace.interleave,
                       zero=zero, recompute=tuple(parse_list(args.recompute, choice(*RECOMPUTE), "--recompute")),
                       sequence_parallel=tuple(yes_no(v, "--sequence-parallel")
                                               for v in parse_list(args.sequence_parallel, str, "--sequence-parallel")),
                       flash_attention=tuple(yes_no(v, "--flash") for v in parse_list(args.flash, str, "--flash")),
                       placements=not args.no_placements, dropout=args.dropout, fp32_grads=args.fp32_grads,
                       dp_overlap=not args.no_dp_overlap, tp_overlap=args.tp_overlap)


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.output import Printer
    from stepscope.perfmodel.search import search
    from stepscope.results.environment import base_environment
    from stepscope.results.store import RecordStore, make_record
    from stepscope.spec import Workload
    from stepscope.spec.system import load_system

    system = load_system(args.system)
    specs = model_specs(args)
    if len(specs) != 1:
        raise UsageError("plan searches one model at a time (give one --model and single override values)")
    spec = specs[0]
    gpus = one_int(args.gpus, "--gpus")
    if gpus is None:
        raise UsageError("plan needs --gpus")
    batch = one_int(args.global_batch, "--global-batch")
    if batch is None:
        raise UsageError("plan needs --global-batch")
    workload = Workload(batch=batch, seq=one_int(args.seq, "--seq", spec.context_length),
                        precision=choice(*PRECISIONS)(args.precision), mode=choice(*MODES)(args.mode))
    workload.check_fits(spec.context_length)
    system.accelerator.matrix_peak(workload.precision)
    space = _space(args)
    top_k, threads = one_int(args.top, "--top"), one_int(args.threads, "--threads")
    store = RecordStore(args.out, "plan").check_writable()
    printer = Printer(args.format)

    bar = _ProgressBar() if not args.no_progress and sys.stderr.isatty() else None
    try:
        result = search(spec, workload, system, gpus, space, top_k=top_k, threads=threads,
                        progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    printer.note(f"{spec.name} on {gpus} x {system.name}, global batch {batch}, seq {workload.seq}, "
                 f"{workload.precision}: evaluated {result.evaluated:,} candidates in {result.seconds:.2f} s "
                 f"({result.configs_per_s:,.0f} configs/s; enumeration {result.enumerate_s:.2f} s, evaluation "
                 f"{result.evaluate_s:.2f} s on {threads} thread{'s' if threads > 1 else ''}); "
                 f"{result.feasible:,} fit in memory")
    if args.explain or not result.top:
        rows = [{"rule": rule, "rejected": count, "example": result.examples.get(rule, "")}
                for rule, count in sorted(result.rejected.items(), key=lambda kv: -kv[1])]
        printer.emit(rows, title="why candidates were rejected (a candidate may break several rules)")
    if not result.top:
        raise UsageError(result.why_none())
    rows = []
    env = base_environment()
    for rank, (plan, m) in enumerate(result.top, 1):
        comm = m["tp_comm_s"] + m["cp_comm_s"] + m["pp_comm_s"] + m["dp_comm_s"]
        rows.append({"rank": rank, "plan": plan.describe(), "placement": ",".join(plan.placement),
                     "tokens_per_s": m["tokens_per_s"], "step_s": m["step_s"], "mfu_pct": m["mfu_pct"],
                     "mem_GiB": m["mem_GiB"], "compute_pct": 100 * (m["forward_compute_s"] + m["backward_compute_s"]
                                                                    + m["recompute_s"]) / m["step_s"],
                     "comm_pct": 100 * comm / m["step_s"], "bubble_pct": 100 * m["bubble_s"] / m["step_s"],
                     "equivalent": m["equivalent_plans"]})
        config = {"model": spec.name, "model_spec": spec.to_dict(), **workload.to_dict(), "gpus": gpus,
                  "system": system.name, "rank": rank, "plan": plan.to_dict()}
        metrics = {**{k: v for k, v in m.items() if k != "feasible"}, "search_evaluated": result.evaluated,
                   "search_feasible": result.feasible, "search_s": result.seconds,
                   "search_configs_per_s": result.configs_per_s}
        store.append(make_record("plan", config, metrics, env=env))
    printer.emit(rows, title=f"top {len(rows)} feasible plans by throughput (equivalent: other plans with the same "
                             "prediction, e.g. another placement of the same groups)")
    printer.note(f"records: {store.path}")
    return 0


class _ProgressBar:
    """A rich progress bar on stderr, shown only for large searches."""

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def update(self, done: int, total: int) -> None:
        if total < PROGRESS_ABOVE:
            return
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._progress = Progress("evaluating", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("plans", total=total)
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
