"""Turn user text into typed ModelSpec field values (`--n-layers 2`, `--tie-embeddings true`)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec.model import ModelSpec, field_choices, field_names

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _optional(name: str) -> bool:
    return type(None) in typing.get_args(typing.get_type_hints(ModelSpec)[name])


def _field_kind(name: str) -> str:
    hints = typing.get_type_hints(ModelSpec)
    hint = hints[name]
    args = typing.get_args(hint)
    if hint is bool:
        return "bool"
    if hint is float:
        return "float"
    if hint is int or int in args:
        return "int"
    return "str"


def parse_field_value(name: str, text: str) -> Any:
    """Parse one override value for ModelSpec field `name` from its command-line text."""
    if name not in field_names():
        raise UsageError(f"unknown model field {name!r}; fields: {', '.join(field_names())}")
    kind = _field_kind(name)
    value = text.strip()
    try:
        if kind == "bool":
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            raise ValueError
        if kind == "int":
            if _optional(name) and value.lower() in {"none", ""}:
                return None
            return int(value.replace("_", ""))
        if kind == "float":
            return float(value)
    except ValueError:
        raise UsageError(f"invalid value {text!r} for --{name.replace('_', '-')} (expected {kind})") from None
    choices = field_choices(name)
    if choices and value not in choices:
        raise UsageError(f"invalid value {text!r} for --{name.replace('_', '-')} (choose {'|'.join(choices)})")
    return value


def override_fields() -> list[tuple[str, str]]:
    """(field name, kind) for every overridable ModelSpec field, in declaration order."""
    return [(f.name, _field_kind(f.name)) for f in dataclasses.fields(ModelSpec) if f.name != "name"]
