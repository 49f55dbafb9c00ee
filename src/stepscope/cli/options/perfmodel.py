"""The performance model's options, declared once for `predict`, `plan`, `compare`, `validate` and `calibrate`:
`--system`, the workload and execution switches of a modelled step, one parallel plan (`plan_from_args`), `plan`'s
search space (`space_from_args`), and the measured records a command reads (the `records` positional and
`--where`). Defaults come from the config
dataclasses they fill (`ParallelPlan`, `ModelledWorkload`, the perfmodel run configs)."""

from __future__ import annotations

import argparse
import math

from stepscope.cli.options import (
    add_config_option,
    choice,
    config_default,
    field_default,
    non_negative_int,
    one_value,
    optional_value,
    parse_list,
    positive_int,
    yes_no,
)
from stepscope.errors import UsageError
from stepscope.perfmodel.runs import ModelledWorkload
from stepscope.perfmodel.search.search import SearchSpace
from stepscope.spec import MODELLED_PRECISIONS, MODES, ModelSpec, Workload
from stepscope.spec.plan import DISPATCHERS, FP8_RECIPES, RECOMPUTE, ParallelPlan
from stepscope.spec.stack import list_stacks, load_stack
from stepscope.spec.system import list_systems


def add_system_option(parser: argparse.ArgumentParser, config: type, option: str = "--system", field: str = "system",
                      help: str = "system preset or TOML file") -> None:
    """A system (preset name or TOML file), default from `config.<field>`."""
    default = config_default(config, field)
    shown = "(default %(default)s)" if default is not None else "(default: each run's own system)"
    parser.add_argument(option, default=default, help=f"{help} {shown}; presets: {', '.join(list_systems())}")


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """Workload of a (distributed) step and the execution switches every plan shares."""
    group = parser.add_argument_group("workload")
    group.add_argument("--gpus", default=None, help="total GPUs (default: the product of the plan)")
    group.add_argument("--global-batch", default=config_default(ModelledWorkload, "global_batch"),
                       help="sequences per step over all replicas (predict default: dp x micro-batch)")
    group.add_argument("--seq", default=config_default(ModelledWorkload, "seq"),
                       help="tokens per sequence (default: the model's context_length)")
    add_config_option(group, ModelledWorkload, "--precision", "|".join(MODELLED_PRECISIONS))
    add_config_option(group, ModelledWorkload, "--mode", "|".join(MODES))
    group = parser.add_argument_group("execution switches")
    group.add_argument("--dropout", action="store_true", help="the run applies dropout (masks kept for backward)")
    group.add_argument("--fp32-grads", action="store_true", help="gradients accumulated and reduced in fp32")
    group.add_argument("--no-dp-overlap", action="store_true", help="gradient reduction after backward, not during")
    group.add_argument("--tp-overlap", action="store_true", help="TP/CP collectives overlap their GEMMs")
    group.add_argument("--ep-overlap", action="store_true",
                       help="MoE all-to-alls hide behind the MoE blocks' GEMMs (DualPipe-like schedules)")
    add_config_option(group, ParallelPlan, "--dispatcher", "MoE token dispatcher: alltoall (every expert copy "
                      "by all-to-all) | deepep (once per node, fanned out over NVLink; DeepEP, HybridEP) | deepep-fp8 "
                      "(and an fp8 forward dispatch in fp8 runs, as DeepSeek-V3)")
    add_config_option(group, ParallelPlan, "--expert-tp", "MoE experts: 0 split over tp like the dense MLP | 1 whole "
                      "on each GPU, EP folded over the TP ranks (Megatron-Core's expert-tensor-parallel size 1)")
    add_config_option(group, ParallelPlan, "--stack", "the training software (how it schedules data-, context-, "
                      "tensor- and pipeline-parallel exchanges, which attention kernel runs): a preset ("
                      + ", ".join(list_stacks()) + ") or a TOML file")
    add_config_option(group, ParallelPlan, "--pipeline-rounds", "pipeline schedules run one after the other per step, "
                      "gradients accumulated across them, each filling and draining the pipeline (gradient "
                      "accumulation outside the schedule: torchtitan, NeMo AutoModel); 1: one schedule (Megatron)")


def training_from_args(args: argparse.Namespace) -> ModelledWorkload:
    """The workload options (`add_training_options`) as given; what was left out is derived later."""
    return ModelledWorkload(global_batch=optional_value(args.global_batch, positive_int, "--global-batch"),
                            seq=optional_value(args.seq, positive_int, "--seq"),
                            precision=one_value(args.precision, choice(*MODELLED_PRECISIONS), "--precision"),
                            mode=one_value(args.mode, choice(*MODES), "--mode"))


def switches_from_args(args: argparse.Namespace) -> dict[str, bool | str | int]:
    """The execution switches (`add_training_options`) as `ParallelPlan` / `SearchSpace` fields."""
    return {"dropout": args.dropout, "fp32_grads": args.fp32_grads, "dp_overlap": not args.no_dp_overlap,
            "tp_overlap": args.tp_overlap, "ep_overlap": args.ep_overlap,
            "dispatcher": one_value(args.dispatcher, choice(*DISPATCHERS), "--dispatcher"),
            "expert_tp": int(one_value(args.expert_tp, choice("0", "1"), "--expert-tp")),
            "pipeline_rounds": one_value(args.pipeline_rounds, positive_int, "--pipeline-rounds"),
            "stack": one_value(args.stack, stack_name, "--stack")}


def stack_name(text: str) -> str:
    """A stack preset name or TOML path (checked: a UsageError naming the presets otherwise)."""
    load_stack(text)
    return text


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """One parallel plan (`ParallelPlan`; its defaults)."""
    group = parser.add_argument_group("plan")
    group.add_argument("--dp", default=None, help="data-parallel replicas (default: GPUs / (tp*pp*cp))")
    for option, help_text in (("--tp", "tensor parallel"), ("--pp", "pipeline stages"), ("--cp", "context parallel"),
                              ("--interleave", "virtual pipeline chunks per stage"),
                              ("--micro-batch", "sequences per micro-batch"),
                              ("--ep", "expert parallel (MoE): experts split over ep of the dp x cp ranks")):
        add_config_option(group, ParallelPlan, option, help_text)
    add_config_option(group, ParallelPlan, "--expert-imbalance", "MoE load imbalance: tokens of the busiest "
                      "expert-parallel rank / the mean (>= 1)")
    group.add_argument("--sequence-parallel", nargs="?", const="yes", default="no", metavar="yes|no",
                       help="Megatron sequence parallelism (a bare --sequence-parallel: yes; default %(default)s)")
    for option, help_text, field in (("--zero", "ZeRO stage 0-3, 1 = distributed optimizer", None),
                                     ("--recompute", "|".join(RECOMPUTE), None),
                                     ("--flash", "fused flash attention: yes|no", "flash_attention"),
                                     ("--placement", "nesting of the groups on ranks, innermost first", None),
                                     ("--first-stage-layers", "layers of the first pipeline stage (0: even split)",
                                      None),
                                     ("--last-stage-layers", "layers of the last pipeline stage (0: even split)",
                                      None),
                                     ("--shard-group", "ZeRO/FSDP shard group size; replicas across groups (HSDP); "
                                      "0: all dp x cp ranks", None),
                                     ("--reshard-after-forward", "ZeRO-3/FSDP: gather weights again for backward: "
                                      "yes|no", None),
                                     ("--fp8-recipe", f"scaling of fp8 GEMMs with --precision fp8: "
                                      f"{'|'.join(FP8_RECIPES)}", None)):
        add_config_option(group, ParallelPlan, option, help_text, field=field)


def plan_from_args(args: argparse.Namespace, spec: ModelSpec) -> tuple[ParallelPlan, Workload]:
    """(ParallelPlan, Workload) from the command line (`add_plan_options`, `add_training_options`), validated
    against `spec`."""
    tp, pp, cp = (one_value(getattr(args, k), positive_int, f"--{k}") for k in ("tp", "pp", "cp"))
    gpus = optional_value(args.gpus, positive_int, "--gpus")
    dp = optional_value(args.dp, positive_int, "--dp")
    if dp is None:
        if gpus is not None and gpus % (tp * pp * cp):
            raise UsageError(f"tp*pp*cp = {tp * pp * cp} does not divide --gpus {gpus}")
        dp = gpus // (tp * pp * cp) if gpus is not None else 1
    micro_batch = one_value(args.micro_batch, positive_int, "--micro-batch")
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=micro_batch, zero=one_value(args.zero, int, "--zero"),
                        recompute=one_value(args.recompute, choice(*RECOMPUTE), "--recompute"),
                        interleave=one_value(args.interleave, positive_int, "--interleave"),
                        sequence_parallel=yes_no(args.sequence_parallel, "--sequence-parallel"),
                        flash_attention=yes_no(args.flash, "--flash"),
                        placement=tuple(parse_list(args.placement, str, "--placement")),
                        first_stage_layers=one_value(args.first_stage_layers, non_negative_int, "--first-stage-layers"),
                        last_stage_layers=one_value(args.last_stage_layers, non_negative_int, "--last-stage-layers"),
                        shard_group=one_value(args.shard_group, non_negative_int, "--shard-group"),
                        reshard_after_forward=yes_no(args.reshard_after_forward, "--reshard-after-forward"),
                        fp8_recipe=one_value(args.fp8_recipe, choice(*FP8_RECIPES), "--fp8-recipe"),
                        ep=one_value(args.ep, positive_int, "--ep"),
                        expert_imbalance=one_value(args.expert_imbalance, float, "--expert-imbalance"),
                        **switches_from_args(args))
    workload = training_from_args(args).workload(spec, batch=dp * micro_batch)
    plan.check(spec, workload.batch, workload.seq, gpus)
    return plan, workload


def add_records_options(parser: argparse.ArgumentParser, config: type) -> None:
    """The measured records a command reads: files or folders (`config.records`) and `--where` filters."""
    default = list(field_default(config, "records"))
    parser.add_argument("records", nargs="*", default=default,
                        help=f"record files or folders (default {', '.join(default)})")
    parser.add_argument("--where", action="append", default=list(field_default(config, "where")),
                        metavar="FIELD=VALUES", help="only records whose config FIELD (dotted, e.g. "
                        "model_spec.n_layers) has one of VALUES; repeatable")


def add_search_options(parser: argparse.ArgumentParser) -> None:
    """The search space of `plan` (`SearchSpace`; its defaults)."""
    group = parser.add_argument_group("search space (comma lists; default: every value that can be valid)")
    for name, default in (("tp", "divisors of --gpus"), ("pp", "divisors of --gpus"), ("cp", "divisors of --gpus"),
                          ("micro-batch", "divisors of --global-batch"),
                          ("ep", "MoE: powers of two up to n_experts dividing dp x cp; 1 for dense models")):
        group.add_argument(f"--{name}", default=config_default(SearchSpace, name.replace("-", "_")),
                           help=f"{name} values to try (default {default})")
    for option, help_text, field in (("--interleave", "interleave values to try", None),
                                     ("--zero", "ZeRO stages to try", None),
                                     ("--recompute", "recompute modes to try", None),
                                     ("--flash", "fused flash attention: yes, no, or no,yes", "flash_attention"),
                                     ("--shard-group", "ZeRO/FSDP shard group sizes to try (0: all dp x cp ranks; "
                                      "smaller: HSDP)", None),
                                     ("--uneven-stages", "also try first/last stages one layer shorter: yes|no", None),
                                     ("--reshard-after-forward", "ZeRO-3/FSDP gathers weights again for backward: "
                                      "yes|no", None),
                                     ("--fp8-recipe", f"scaling of fp8 GEMMs with --precision fp8: "
                                      f"{'|'.join(FP8_RECIPES)}", None)):
        add_config_option(group, SearchSpace, option, help_text, field=field)
    group.add_argument("--sequence-parallel", nargs="?", const="yes", metavar="yes|no",
                       default=config_default(SearchSpace, "sequence_parallel"),
                       help="sequence parallelism: no, yes, or no,yes (a bare --sequence-parallel: yes; default "
                            "%(default)s)")
    add_config_option(group, SearchSpace, "--expert-imbalance", "MoE load imbalance of every plan: tokens of the "
                      "busiest expert-parallel rank / the mean (>= 1)")
    group.add_argument("--no-placements", action="store_true",
                       help="only Megatron's rank order (tp, cp, dp, pp) instead of every placement")


def _imbalance(text: str) -> float:
    value = one_value(text, float, "--expert-imbalance")
    if not (math.isfinite(value) and value >= 1.0):
        raise UsageError(f"--expert-imbalance must be a finite number of at least 1 (max/mean tokens per expert), "
                         f"got {text}")
    return value


def space_from_args(args: argparse.Namespace) -> SearchSpace:
    """The search space options as a `SearchSpace`."""

    def ints(option: str, text: str | None) -> tuple[int, ...] | None:
        return None if text is None else tuple(parse_list(text, positive_int, option))

    def switches(option: str, text: str) -> tuple[bool, ...]:
        return tuple(yes_no(v, option) for v in parse_list(text, str, option))

    zero = tuple(parse_list(args.zero, int, "--zero"))
    if any(z not in (0, 1, 2, 3) for z in zero):
        raise UsageError(f"--zero values must be 0, 1, 2 or 3, got {args.zero}")
    return SearchSpace(tp=ints("--tp", args.tp), pp=ints("--pp", args.pp), cp=ints("--cp", args.cp),
                       micro_batch=ints("--micro-batch", args.micro_batch), ep=ints("--ep", args.ep),
                       expert_imbalance=_imbalance(args.expert_imbalance),
                       interleave=ints("--interleave", args.interleave),
                       zero=zero, recompute=tuple(parse_list(args.recompute, choice(*RECOMPUTE), "--recompute")),
                       sequence_parallel=switches("--sequence-parallel", args.sequence_parallel),
                       flash_attention=switches("--flash", args.flash), placements=not args.no_placements,
                       shard_group=tuple(parse_list(args.shard_group, non_negative_int, "--shard-group")),
                       uneven_stages=yes_no(args.uneven_stages, "--uneven-stages"),
                       reshard_after_forward=yes_no(args.reshard_after_forward, "--reshard-after-forward"),
                       fp8_recipe=one_value(args.fp8_recipe, choice(*FP8_RECIPES), "--fp8-recipe"),
                       **switches_from_args(args))
