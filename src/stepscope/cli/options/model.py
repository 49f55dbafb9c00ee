"""Model and workload options: `--model PRESET` with a `--<field>` override for every ModelSpec field, and the
workload of a measured step (`step`, `profile`, `memory`) with the `StepConfig`s they make. Comma lists sweep:
every combination is a point."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from stepscope.cli.options import (
    add_device_option,
    add_seed_option,
    add_threads_option,
    choice,
    config_default,
    parse_list,
    positive_int,
    threads_list,
    unique,
)
from stepscope.measure.step.config import StepConfig
from stepscope.spec import MODES, PRECISIONS, ModelSpec, Workload, get_preset, parse_field_value
from stepscope.spec.overrides import override_fields

T = TypeVar("T")


def add_model_options(parser: argparse.ArgumentParser, default: str = "small") -> None:
    """`--model PRESET[,PRESET]` plus `--<field> VALUE[,VALUE]` for every ModelSpec field."""
    group = parser.add_argument_group("model (comma lists sweep)")
    group.add_argument("--model", default=default, help=f"preset name(s) (default {default}); "
                       "see `stepscope models`")
    for name, kind in override_fields():
        group.add_argument(f"--{name.replace('_', '-')}", dest=f"override_{name}", metavar=kind.upper(),
                           default=None, help=f"override the preset's {name}")


def overrides_given(args: argparse.Namespace) -> bool:
    """Whether any `--<field>` override was given."""
    return any(getattr(args, f"override_{name}", None) is not None for name, _ in override_fields())


def listed_once(args: argparse.Namespace) -> Callable[[list[T]], list[T]]:
    """How a list option's values become points: each once (`unique`), except in an A/B run, which may compare
    a setup with itself (A/A)."""
    return (lambda values: values) if getattr(args, "ab", False) else unique


def model_specs(args: argparse.Namespace) -> list[ModelSpec]:
    """Every combination of the listed presets and listed field overrides, validated."""
    once = listed_once(args)
    names = once(parse_list(args.model, str, "--model"))
    override_lists: list[tuple[str, list[Any]]] = []
    for name, _ in override_fields():
        text = getattr(args, f"override_{name}", None)
        if text is not None:
            option = f"--{name.replace('_', '-')}"
            override_lists.append((name, once(parse_list(text, lambda item, n=name: parse_field_value(n, item),
                                                         option))))
    specs = []
    for preset in names:
        for values in itertools.product(*(values for _, values in override_lists)):
            overrides = {name: value for (name, _), value in zip(override_lists, values, strict=True)}
            specs.append(get_preset(preset, **overrides))
    return specs


def add_workload_options(parser: argparse.ArgumentParser, step_config: type) -> None:
    """Workload and execution options of a measured step (defaults: `Workload` and `step_config`)."""
    group = parser.add_argument_group("workload (comma lists sweep)")
    group.add_argument("--batch", default=config_default(Workload, "batch"),
                       help="sequences per step (default %(default)s)")
    group.add_argument("--seq", default=config_default(Workload, "seq"),
                       help="tokens per sequence (default %(default)s)")
    group.add_argument("--mode", default=config_default(Workload, "mode"),
                       help=f"{'|'.join(MODES)} (default %(default)s)")
    group.add_argument("--precision", default=config_default(Workload, "precision"),
                       help=f"{'|'.join(PRECISIONS)} (default %(default)s)")
    group.add_argument("--attention", default=config_default(step_config, "attention"),
                       help="attention backend: naive|sdpa|compiled|flash-torch|flash-triton (default %(default)s)")
    group.add_argument("--moe-impl", default=config_default(step_config, "moe_impl"),
                       help="routed experts of an MoE model: grouped|reference (default %(default)s)")
    group.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported apart)")
    add_device_option(group, step_config)


def workload_grid(args: argparse.Namespace) -> list[tuple[ModelSpec, Workload, str]]:
    """(spec, workload, attention) for every combination of the listed values, validated."""
    specs = model_specs(args)
    once = listed_once(args)
    batches = once(parse_list(args.batch, positive_int, "--batch"))
    seqs = once(parse_list(args.seq, positive_int, "--seq"))
    modes = once(parse_list(args.mode, choice(*MODES), "--mode"))
    precisions = once(parse_list(args.precision, choice(*PRECISIONS), "--precision"))
    attentions = once(parse_list(args.attention, str, "--attention"))
    return [(spec, Workload(batch=batch, seq=seq, precision=precision, mode=mode), attention)
            for spec, batch, seq, mode, precision, attention
            in itertools.product(specs, batches, seqs, modes, precisions, attentions)]


def add_step_options(parser: argparse.ArgumentParser) -> None:
    """What `step`, `profile` and `memory` share: model, workload, `--seed`, `--threads` (`StepConfig`'s
    defaults); `step_configs` reads them back."""
    add_model_options(parser)
    add_workload_options(parser, StepConfig)
    add_seed_option(parser, StepConfig)
    add_threads_option(parser)


def step_configs(args: argparse.Namespace, warmups: list[int], iters: list[int]) -> list[StepConfig]:
    """A `StepConfig` per combination of the listed model, workload, warmup, iters and threads values."""
    from stepscope.nn.moe import MOE_IMPLS  # only when configs are made: building the parser stays torch-free

    once = listed_once(args)
    impls = once(parse_list(args.moe_impl, choice(*MOE_IMPLS), "--moe-impl"))
    return [StepConfig(model=spec, workload=workload, attention=attention, device=args.device, compile=args.compile,
                       warmup=warmup, iters=n, threads=threads, seed=args.seed, moe_impl=impl)
            for (spec, workload, attention), impl, warmup, n, threads
            in itertools.product(workload_grid(args), impls, once(warmups), once(iters), once(threads_list(args)))]
