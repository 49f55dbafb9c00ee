"""The one way stepscope stops the processes it started: spawned ranks, an mpiexec job, the innet switch.

    stop_processes(processes, grace_s=5.0)                      # SIGTERM, wait, SIGKILL, reap
    stop_processes([mpiexec], grace_s=5.0, whole_group=True)    # the job's whole process group

Every live process gets SIGTERM; all of them share one grace period to exit (so N ranks never wait N
times); whatever is still there is killed with SIGKILL and reaped. `whole_group=True` signals the process
group a process leads (it was started in a session of its own: mpiexec with its daemon and ranks), and the
final SIGKILL goes to the group even when its leader already exited, so no rank outlives its launcher.
A Ctrl-C while waiting kills at once before it propagates: a second Ctrl-C never leaves a process behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import time
from collections.abc import Sequence

Process = mp.process.BaseProcess | subprocess.Popen


def is_running(process: Process) -> bool:
    """Started and not yet exited (a process that was never started is not running)."""
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    return process.pid is not None and process.is_alive()


def wait_for(process: Process, timeout_s: float) -> None:
    """Wait up to `timeout_s` for `process` to exit (reaping it if it does)."""
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            pass
    elif process.pid is not None:
        process.join(max(0.0, timeout_s))


def stop_processes(processes: Sequence[Process], grace_s: float, *, whole_group: bool = False) -> None:
    """Stop every process of `processes` (see the module docstring); returns once all are reaped."""
    started = [p for p in processes if p.pid is not None]  # a Ctrl-C may come between two starts
    try:
        for process in started:
            if is_running(process):
                _signal(process, signal.SIGTERM, whole_group)
        deadline = time.monotonic() + grace_s
        for process in started:
            wait_for(process, deadline - time.monotonic())
    finally:
        for process in started:
            if whole_group or is_running(process):
                _signal(process, signal.SIGKILL, whole_group)
        for process in started:
            wait_for(process, 2.0)


def _signal(process: Process, sig: signal.Signals, whole_group: bool) -> None:
    try:
        if whole_group:
            os.killpg(process.pid, sig)
        else:
            os.kill(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # gone already
        pass
