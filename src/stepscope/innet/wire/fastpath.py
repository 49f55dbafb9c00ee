"""Which data path runs: stepscope's C fast path (the `stepscope.innet._fastpath` extension, built from
`innet/csrc/` at install time) or the numpy path beside it. Both implement the same protocol to the bit
(tests/innet/test_fastpath.py runs both against the per-packet reference and against each other).

The environment chooses for every process of a run (the switch and the ranks inherit it):
STEPSCOPE_INNET_DATA_PATH=auto (default: C where it was built), numpy (the numpy path everywhere: the "before"
of docs/innet.md's table, or a second opinion), c (the C path, or an error where it was not built). Objects
that hold a path (`batch_io.Receiver`/`Sender`, the switch, a worker's op) choose it when they are made and
also take `data_path` to override the environment (the tests run both paths in one process).

    native = fastpath.resolve()          # the C module, or None for the numpy path
    fastpath.describe(native)            # the line a command prints: which path runs and why
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from stepscope.errors import UsageError

ENV = "STEPSCOPE_INNET_DATA_PATH"
CHOICES = ("auto", "c", "numpy")


def _load() -> tuple[ModuleType | None, str]:
    try:  # by name: `stepscope.innet` may still be importing this module
        return importlib.import_module("stepscope.innet._fastpath"), ""
    except ImportError as error:  # not built: no compiler at install time, or a source checkout never installed
        return None, str(error)


C, NOT_BUILT = _load()
"""The extension module, or None (NOT_BUILT says why)."""


def resolve(data_path: str | None = None) -> ModuleType | None:
    """The C module to use, or None for the numpy path: `data_path` ('auto', 'c', 'numpy'), else the
    environment's choice (auto when unset)."""
    choice = data_path or os.environ.get(ENV) or "auto"
    if choice not in CHOICES:
        raise UsageError(f"{ENV} must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "numpy":
        return None
    if C is None and choice == "c":
        raise UsageError(f"{ENV}=c but stepscope's C fast path is not built ({NOT_BUILT}); reinstall with a C "
                         f"compiler present (pip install -e .)")
    return C


def name(native: ModuleType | None) -> str:
    """'c' or 'numpy' (what records hold)."""
    return "c" if native is not None else "numpy"


def describe(native: ModuleType | None) -> str:
    """Which path runs, in words."""
    if native is not None:
        return "data path c (stepscope's C fast path)"
    if C is None:
        return f"data path numpy (the C fast path is not built: {NOT_BUILT})"
    return f"data path numpy ({ENV}={os.environ.get(ENV)})"
