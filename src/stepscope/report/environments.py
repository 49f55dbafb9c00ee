"""Where a section's records were measured: the distinct environments (host, devices, versions, git sha), with
their command lines and time span, and a warning for every field that differs between records that a reader
would put side by side (a study mixing hosts, torch builds or code versions compares more than one thing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

IDENTITY_FIELDS = ("hostname", "cpu_model", "cores", "device", "device_name", "threads", "world_size", "backend",
                   "torch", "python", "stepscope_version", "git_sha")
"""What tells one environment from another (time and command line do not: they differ on every run)."""
MIXED_FIELDS = ("hostname", "cpu_model", "device_name", "torch", "python", "stepscope_version", "git_sha")
"""Fields whose mixing is warned about: the machine and the software. Threads and world size vary on purpose
in a sweep (`--threads 1,2`, `--world 2,4`), so they are shown but not warned about."""


@dataclass
class Environment:
    """One distinct environment and the records measured in it."""

    fields: dict[str, Any]
    records: int = 0
    first_utc: str | None = None
    last_utc: str | None = None
    commands: dict[str, None] = field(default_factory=dict)
    """Distinct command lines in first-seen order."""


def environments(records: Sequence[dict[str, Any]]) -> list[Environment]:
    """The distinct environments of `records`, in first-seen order."""
    found: dict[tuple, Environment] = {}
    for record in records:
        env = record.get("env") or {}
        key = tuple(str(env.get(name)) for name in IDENTITY_FIELDS)
        entry = found.get(key)
        if entry is None:
            entry = found[key] = Environment({name: env[name] for name in IDENTITY_FIELDS
                                              if env.get(name) is not None})
        entry.records += 1
        when = env.get("utc_time")
        if isinstance(when, str):
            entry.first_utc = when if entry.first_utc is None else min(entry.first_utc, when)
            entry.last_utc = when if entry.last_utc is None else max(entry.last_utc, when)
        if env.get("command"):
            entry.commands.setdefault(str(env["command"]), None)
    return list(found.values())


def mixed_warnings(found: Sequence[Environment]) -> list[str]:
    """One line per MIXED_FIELDS field with more than one value among the environments `found` (of one section or
    of the whole study; an environment without the field is left out)."""
    warnings = []
    for name in MIXED_FIELDS:
        counts: dict[str, int] = {}
        for env in found:
            if name in env.fields:
                counts[str(env.fields[name])] = counts.get(str(env.fields[name]), 0) + env.records
        if len(counts) > 1:
            values = ", ".join(f"{value} ({n} records)" for value, n in counts.items())
            warnings.append(f"mixed {name}: {values}")
    return warnings
