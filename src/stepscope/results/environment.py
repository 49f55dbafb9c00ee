"""Where a record was made: package version and git sha, host, CPU, time, command line. No torch here;
`stepscope.measure.environment` adds torch and device fields on top."""

from __future__ import annotations

import datetime as dt
import functools
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the stepscope checkout this package runs from (None for an installed wheel)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
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
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else ""


def base_environment() -> dict[str, Any]:
    from stepscope import __version__

    return {
        "stepscope_version": __version__,
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": usable_cores(),
        "utc_time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
    }
