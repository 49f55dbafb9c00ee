"""Command-line options shared by several commands: model selection with field overrides, comma-list
sweeps, output folder and format. Parsing only; the commands call library functions with typed values."""

from __future__ import annotations

import argparse
import itertools
from typing import Any, Callable, Sequence, TypeVar

from stepscope.errors import UsageError
from stepscope.results.store import DEFAULT_OUT
from stepscope.results.views import FORMATS
from stepscope.spec import ModelSpec, get_preset, parse_field_value
from stepscope.spec.overrides import override_fields

T = TypeVar("T")


def parse_list(text: str | Sequence[str], convert: Callable[[str], T], option: str) -> list[T]:
    """`"128,256"` -> [128, 256]; empty items or unconvertible values are usage errors."""
    if not isinstance(text, str):
        return [convert(item) if isinstance(item, str) else item for item in text]
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(item == "" for item in items):
        raise UsageError(f"malformed list {text!r} for {option} (expected comma-separated values)")
    out = []
    for item in items:
        try:
            out.append(convert(item))
        except UsageError:
            raise
        except (ValueError, TypeError):
            raise UsageError(f"invalid value {item!r} in {option} {text!r}") from None
    return out


def positive_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if value <= 0:
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 0:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # also refuses nan
        raise ValueError(text)
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise ValueError(text)
    return value


def choice(*allowed: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise UsageError(f"invalid choice {text!r} (choose from {', '.join(allowed)})")
        return text

    return convert


def add_model_options(parser: argparse.ArgumentParser, default: str = "small") -> None:
    """`--model PRESET[,PRESET]` plus `--<field> VALUE[,VALUE]` for every ModelSpec field."""
    group = parser.add_argument_group("model (comma lists sweep)")
    group.add_argument("--model", default=default, help=f"preset name(s) (default {default}); "
                       "see `stepscope models`")
    for name, kind in override_fields():
        group.add_argument(f"--{name.replace('_', '-')}", dest=f"override_{name}", metavar=kind.upper(),
                           default=None, help=f"override the preset's {name}")


def model_specs(args: argparse.Namespace) -> list[ModelSpec]:
    """Every combination of the listed presets and listed field overrides, validated."""
    names = parse_list(args.model, str, "--model")
    override_lists: list[tuple[str, list[Any]]] = []
    for name, _ in override_fields():
        text = getattr(args, f"override_{name}", None)
        if text is not None:
            option = f"--{name.replace('_', '-')}"
            override_lists.append((name, parse_list(text, lambda item, n=name: parse_field_value(n, item), option)))
    specs = []
    for preset in names:
        for values in itertools.product(*(values for _, values in override_lists)):
            overrides = {name: value for (name, _), value in zip(override_lists, values)}
            specs.append(get_preset(preset, **overrides))
    return specs


def add_output_options(parser: argparse.ArgumentParser, resume: bool = True) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--out", default=DEFAULT_OUT, help=f"folder for JSON-Lines records (default {DEFAULT_OUT})")
    group.add_argument("--format", default="table", choices=FORMATS, help="how to print results")
    if resume:
        group.add_argument("--resume", action="store_true", help="skip points already recorded in --out")


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", default=None,
                        help="CPU intra-op threads (comma list sweeps; default: PyTorch's choice)")


def threads_list(args: argparse.Namespace) -> list[int | None]:
    return [None] if args.threads is None else parse_list(args.threads, positive_int, "--threads")
