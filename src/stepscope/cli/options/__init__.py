"""Command-line options, declared once for every command that shares them, and the parsing of their text.

- Values: `parse_list` (a comma list sweeps), `one_value` (an option that takes exactly one value), and the
  converters (`positive_int`, `fraction`, `choice(...)`, `yes_no`, ...) that name the bad value in one line.
- Defaults: an option that fills a config dataclass reads its default from that dataclass
  (`config_default(StepConfig, "warmup")`), so each default is defined once, where it is documented.
- Shared groups: output (`--out --format --resume`), plots (`--plot --no-plot`), `--threads`, `--seed`,
  `--device`; model and workload options live in `options.model`, the performance model's in
  `options.perfmodel`, in-network aggregation's in `options.innet`.
Parsing only: commands hand typed values to library functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from stepscope.errors import UsageError
from stepscope.results.store import DEFAULT_OUT
from stepscope.results.views import FORMATS

T = TypeVar("T")
YES_NO = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}


# ---- values -------------------------------------------------------------------------------------------------
def parse_list(text: str | Sequence[str], convert: Callable[[str], T], option: str) -> list[T]:
    """`"128,256"` -> [128, 256]; empty items or unconvertible values are usage errors. Duplicates stay (an A/A
    run compares a setup with itself): sweeps drop them with `unique`."""
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


def unique(values: Sequence[T]) -> list[T]:
    """The values in their order, each once: a sweep would measure a point given twice twice, under one key."""
    return list(dict.fromkeys(values))


def one_value(text: Any, convert: Callable[[str], T], option: str) -> T:
    """Exactly one value from the command line (a comma list is a usage error here)."""
    values = parse_list(str(text), convert, option)
    if len(values) != 1:
        raise UsageError(f"{option} takes one value, got {text!r}")
    return values[0]


def optional_value(text: Any, convert: Callable[[str], T], option: str) -> T | None:
    """`one_value`, or None when the option was not given."""
    return None if text is None else one_value(text, convert, option)


MAX_INT = 2**62
"""Counts (batch, sizes, steps) fit a signed 64-bit integer with room for products: torch and NCCL take int64."""


def positive_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if not 0 < value <= MAX_INT:
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    value = int(text.replace("_", ""))
    if not 0 <= value <= MAX_INT:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:  # also refuses nan: timeouts, sizes and rates are finite
        raise ValueError(text)
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:  # also refuses nan
        raise ValueError(text)
    return value


def fraction(text: str) -> float:
    """A probability in [0, 1)."""
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError(text)
    return value


def probability(text: str) -> float:
    """A probability in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


def choice(*allowed: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in allowed:
            raise UsageError(f"invalid choice {text!r} (choose from {', '.join(allowed)})")
        return text

    return convert


def yes_no(text: str, option: str) -> bool:
    if text.lower() not in YES_NO:
        raise UsageError(f"invalid value {text!r} for {option} (choose yes or no)")
    return YES_NO[text.lower()]


# ---- defaults from the config dataclasses ---------------------------------------------------------------------
def field_default(config: type, name: str) -> Any:
    """The default value of field `name` of dataclass `config`."""
    field = next((f for f in dataclasses.fields(config) if f.name == name), None)
    if field is None:
        raise AttributeError(f"{config.__name__} has no field {name!r}")
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise AttributeError(f"{config.__name__}.{name} has no default")


def config_default(config: type, name: str, show: Callable[[Any], str] | None = None) -> str | None:
    """The default of field `name` of dataclass `config`, as the text an option would be given (None stays
    None: "not given"). Tuples become comma lists; `show` formats each value (e.g. sizes as `1K`)."""
    return _as_text(field_default(config, name), show or _text)


def _as_text(value: Any, show: Callable[[Any], str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, tuple | list):
        return ",".join(show(item) for item in value)
    return show(value)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def add_config_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config: type,
                      flags: str | tuple[str, ...],
                      help: str, *, field: str | None = None, show: Callable[[Any], str] | None = None,
                      none: str | None = None) -> None:
    """An option whose default is field `field` of `config` (default: named as the last flag), as text (`show`
    formats each value; `none` spells a None default, e.g. `auto`); the help names the default."""
    flags = (flags,) if isinstance(flags, str) else flags
    default = config_default(config, field or flags[-1].lstrip("-").replace("-", "_"), show)
    default = none if default is None else default
    parser.add_argument(*flags, default=default, help=help if default is None else f"{help} (default %(default)s)")


def add_alias(parser: argparse.ArgumentParser | argparse._ArgumentGroup, alias: str, canonical: str) -> None:
    """Keep an old spelling of option `canonical` working: `alias` does what it does (same destination, type and
    values) but is not listed in --help, whose text names it once ("formerly ..."). docs/vocabulary.md lists every
    alias; the vocabulary test refuses one it does not list."""
    action = next(a for a in parser._actions if canonical in a.option_strings)
    copy = argparse.Action.__new__(type(action))
    copy.__dict__.update(action.__dict__, option_strings=[alias], default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                         alias_of=canonical)
    parser._add_action(copy)
    if action.help not in (None, argparse.SUPPRESS):
        action.help = f"{action.help}; formerly {alias}" if "formerly" not in action.help else f"{action.help}, {alias}"


# ---- commands -------------------------------------------------------------------------------------------------
def add_command(subparsers: argparse._SubParsersAction, command: ModuleType) -> argparse.ArgumentParser:
    """The parser of a command module: its `NAME`, `HELP` and `DESCRIPTION`, the options its
    `add_options(parser)` declares, and its `run(args)` as what the command does (a group command such as
    `innet` has subcommands instead, each a command module)."""
    parser = subparsers.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
    command.add_options(parser)
    if hasattr(command, "run"):
        parser.set_defaults(func=command.run)
    return parser


def add_subcommands(parser: argparse.ArgumentParser, dest: str, metavar: str) -> argparse._SubParsersAction:
    """The subcommands of a group command (`innet`, `precision`): one must be given."""
    return parser.add_subparsers(dest=dest, metavar=metavar, required=True, parser_class=type(parser))


# ---- option groups shared by several commands -----------------------------------------------------------------
def add_output_options(parser: argparse.ArgumentParser, *, resume: bool = True,
                       formats: Sequence[str] = FORMATS, resume_help: str | None = None) -> None:
    """`-o/--out`, `--format` and (for commands that sweep) `--resume`."""
    group = parser.add_argument_group("output")
    group.add_argument("-o", "--out", default=DEFAULT_OUT,
                       help=f"folder for JSON-Lines records (default {DEFAULT_OUT})")
    group.add_argument("--format", default="table", choices=list(formats), help="how to print results")
    if resume:
        group.add_argument("--resume", action="store_true",
                           help=resume_help or "skip points already recorded in --out")


def add_plot_options(parser: argparse.ArgumentParser, default_name: str) -> None:
    """`--plot PATH` (default `<out>/<default_name>`) and `--no-plot`."""
    group = parser.add_argument_group("plot")
    group.add_argument("--plot", default=None, help=f"PNG path (default <out>/{default_name})")
    group.add_argument("--no-plot", action="store_true", help="do not write the plot")


def add_threads_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       help: str = "CPU intra-op threads (comma list sweeps; default: PyTorch's choice)") -> None:
    parser.add_argument("--threads", default=None, help=help)


def threads_list(args: argparse.Namespace) -> list[int | None]:
    return [None] if args.threads is None else parse_list(args.threads, positive_int, "--threads")


def add_seed_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config: type,
                    help: str = "seed for weights and data") -> None:
    parser.add_argument("--seed", type=int, default=field_default(config, "seed"), help=f"{help} (default %(default)s)")


def add_device_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config: type) -> None:
    parser.add_argument("--device", default=config_default(config, "device"),
                        help="auto|cpu|cuda (default %(default)s)")
