"""Where a record was made: package version and git sha, host, CPU, time, command line. No torch here;
`stepscope.measure.environment` adds torch and device fields on top."""

from __future__ import annotations

import datetime as dt
import platform
import socket
from typing import Any

from stepscope.host import command_line, cpu_model, git_sha, usable_cores


def base_environment() -> dict[str, Any]:
    """The torch-free part of a record's `env`."""
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
