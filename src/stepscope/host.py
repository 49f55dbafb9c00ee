"""Facts about this host and this run: cores, CPU model, the stepscope checkout's git sha, the command line.

The ground floor with `errors`: no stepscope import, no torch. Records (`results.environment`), the
launcher's rank limit and the benchmarks' thread defaults all read them from here.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the stepscope checkout this package runs from (None for an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if out.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):  # no git, or a slow file system: the sha is optional
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return out.stdout.strip() + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (respects affinity masks and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def command_line() -> str:
    """The command as typed, e.g. `stepscope step --model small` (also for `python -m stepscope`)."""
    if not sys.argv or not sys.argv[0]:
        return ""
    program = Path(sys.argv[0])
    name = program.parent.name if program.name == "__main__.py" else program.name
    return shlex.join([name, *sys.argv[1:]])
