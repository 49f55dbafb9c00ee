"""What the performance-model runs (`run_predict`, `run_plan`, `run_compare`, `run_validate`, `run_calibrate`)
share: the system a prediction assumes when none is named, the workload of a modelled step as `predict` and
`plan` take it (`ModelledWorkload`), and the record file a run appends to (`RunRecords`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.results.environment import base_environment
from stepscope.results.store import RecordStore, make_record
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.system import SystemSpec, load_system

DEFAULT_SYSTEM = "A100-80GB"
"""The system `predict`, `plan` and `validate` assume when none is named (the published runs ran on it)."""

SystemLike = str | os.PathLike | SystemSpec
"""A preset name, a system TOML file, or a loaded system."""


def system_of(system: SystemLike) -> SystemSpec:
    """The system named by a preset, a TOML path, or given as is."""
    return system if isinstance(system, SystemSpec) else load_system(system)


def check_choice(value: str, allowed: Sequence[str]) -> str:
    """`value`, or a UsageError worded as the command line words a bad choice."""
    if value not in allowed:
        raise UsageError(f"invalid choice {value!r} (choose from {', '.join(allowed)})")
    return value


@dataclass(frozen=True)
class ModelledWorkload:
    """A modelled step's work before the model is known; None means derived from the model or the plan."""

    global_batch: int | None = None
    """Sequences per step over all replicas (None: `predict` takes dp x micro-batch; `plan` needs it)."""
    seq: int | None = None
    """Tokens per sequence (None: the model's context_length)."""
    precision: str = "bf16"
    """Large runs train in mixed precision (the measured `step` defaults to fp32, `Workload`'s default)."""
    mode: str = Workload.mode
    """fwd, fwd-bwd or train (the same default as a measured step)."""

    def workload(self, model: ModelSpec, batch: int | None = None) -> Workload:
        """The global-batch `Workload` of `model` (`batch` when no global batch was given), checked to fit its
        context length."""
        workload = Workload(batch=self.global_batch if self.global_batch is not None else batch,
                            seq=self.seq if self.seq is not None else model.context_length,
                            precision=self.precision, mode=self.mode)
        workload.check_fits(model.context_length)
        return workload


class RunRecords:
    """The records of one run in `<out>/<kind>.jsonl`, proven writable when made (so before any work); with
    `out` None nothing is written. Every record of a run carries the same environment."""

    def __init__(self, out: str | os.PathLike | None, kind: str) -> None:
        self.kind = kind
        self._store = RecordStore(out, kind).check_writable() if out is not None else None
        self._env: dict[str, Any] | None = None

    @property
    def path(self) -> Path | None:
        """The records file (None: no records are written)."""
        return self._store.path if self._store is not None else None

    def append(self, config: dict[str, Any], metrics: dict[str, Any]) -> None:
        if self._store is None:
            return
        if self._env is None:
            self._env = base_environment()
        self._store.append(make_record(self.kind, config, metrics, env=self._env))
