"""A benchmark's config dataclass as a JSON plan and back: how a parent hands a run to the program it traces
(`traced_job`), readable like a record's config, never pickled. Nested dataclasses, tuples and optional fields
come back as the types their annotations name.

    text = plan_json(config)                  # dataclasses.asdict, as JSON
    config = plan_from_json(BenchConfig, text)
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def plan_json(config: Any) -> str:
    """`config` (a dataclass instance) as JSON: its fields, nested dataclasses as objects, tuples as lists."""
    return json.dumps(dataclasses.asdict(config))


def plan_from_json(cls: type[T], text: str) -> T:
    """The `cls` instance `plan_json` wrote."""
    return _build(cls, json.loads(text))


def _build(hint: Any, value: Any) -> Any:
    """`value` (from JSON) as the type `hint` names: a dataclass, a tuple, an optional, or as it is."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # `X | None`: the one type that is not None
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _build(inner, value)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _build(hints[f.name], value[f.name]) for f in dataclasses.fields(hint)
                       if f.name in value})
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], item) for item in value)
        return tuple(_build(arg, item) for arg, item in zip(args, value, strict=True))
    return value
