"""Named ranges around the phases of a training step, so a profiler (and Nsight Systems) can tell them apart:
`stepscope.forward`, `stepscope.backward`, `stepscope.optimizer`, and `stepscope.init` around building it.
`profile` attributes its events to phases by these ranges; `memory` splits its allocation timeline by them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
RANGE_PREFIX = "stepscope."
INIT_RANGE = RANGE_PREFIX + "init"
ACTIVE_RANGE = RANGE_PREFIX + "active"
"""The NVTX range around a profile's active steps (`nsys profile --capture-range=nvtx --nvtx-capture=...`)."""


def range_name(phase: str) -> str:
    """The record_function / NVTX range name of a phase, e.g. `stepscope.forward`."""
    return RANGE_PREFIX + phase


def phase_region(nvtx: bool = False) -> Callable[[str], contextlib.AbstractContextManager]:
    """`region(phase)` for `TrainingStep.run`: a profiler range, and an NVTX range too when asked (CUDA)."""

    @contextlib.contextmanager
    def region(phase: str) -> Iterator[None]:
        with torch.profiler.record_function(range_name(phase)), nvtx_range(range_name(phase), nvtx):
            yield

    return region


def nvtx_range(name: str, enabled: bool) -> contextlib.AbstractContextManager:
    return torch.cuda.nvtx.range(name) if enabled else contextlib.nullcontext()
