"""Run a collective sweep on mpi4py: stepscope starts `mpiexec` itself and watches it.

    outcome = run_mpi(points, world_size=4, out_dir="stepscope-results", timeout_s=300)

The command line is `mpiexec [--allow-run-as-root] [--oversubscribe] -n N python -m
stepscope.distributed.collectives.mpi_rank PLAN.json`: Open MPI refuses to run as root without the first flag and more
ranks than cores without the second, so they are added exactly when needed (MPICH needs neither).

Never a hang: rank 0 reports every finished point on stdout; if nothing arrives for `timeout_s`
seconds, or the user presses Ctrl-C, the whole process group (mpiexec, its daemon, the ranks) gets
SIGTERM, then SIGKILL. A rank that raises reports its error and aborts the job; the parent raises
`DistributedError` with that rank's message and traceback tail.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from stepscope.distributed.collectives.backends import MPI_INSTALL, find_mpiexec
from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.collectives.mpi_rank import EVENT_PREFIX
import stepscope
from stepscope.errors import DistributedError, UsageError


@dataclass
class MpiOutcome:
    """Records rank 0 wrote (in order) and, per record, every rank's raw tally (or None)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tallies: list[list[dict[str, Any]] | None] = field(default_factory=list)


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


def run_mpi(points: list[CommPoint], *, world_size: int, out_dir: str | None, tally: bool = False,
            timeout_s: float = 300.0, teardown_s: float = 5.0,
            on_point: Callable[[dict[str, Any]], None] | None = None) -> MpiOutcome:
    """Measure `points` on `world_size` mpi4py ranks (see the module docstring)."""
    outcome = MpiOutcome()
    with tempfile.TemporaryDirectory(prefix="stepscope-mpi-") as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps({"points": [dataclasses.asdict(p) for p in points], "out_dir": out_dir,
                                    "tally": tally}))
        command = mpiexec_command(world_size, sys.executable, "-m", "stepscope.distributed.collectives.mpi_rank", str(plan))
        env = dict(os.environ)
        source_root = str(Path(stepscope.__file__).resolve().parents[1])  # ranks import this very stepscope
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                   start_new_session=True)
        stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        reader = threading.Thread(target=_drain_stderr, args=(process.stderr, stderr_tail), daemon=True)
        reader.start()
        try:
            error, done = _follow(process, outcome, timeout_s, on_point)
            if done:  # let the ranks finalize MPI on their own before anything is signalled
                _wait_quietly(process, max(10.0, teardown_s))
        finally:
            _stop(process, teardown_s)
            reader.join(2.0)
    if error is not None:
        raise error
    if not done or len(outcome.records) < len(points):
        tail = "\n".join(stderr_tail)
        raise DistributedError(f"mpiexec exited with code {process.returncode} after {len(outcome.records)} of "
                               f"{len(points)} point(s)", details=tail)
    return outcome


def _follow(process: subprocess.Popen, outcome: MpiOutcome, timeout_s: float,
            on_point: Callable[[dict[str, Any]], None] | None) -> tuple[DistributedError | None, bool]:
    """Read rank 0's events until `done`, an error, the end of the job, or `timeout_s` of silence;
    returns (the error to raise, whether rank 0 reported `done`)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    pending = b""
    last_news = time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            data = os.read(fd, 1 << 16)
            if not data:  # stdout closed: the job is over
                _wait_quietly(process, 5.0)
                return None, False
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                event = _parse_event(line)
                if event is None:
                    continue
                last_news = time.monotonic()
                kind = event.get("event")
                if kind == "point":
                    outcome.records.append(event["record"])
                    outcome.tallies.append(event.get("tallies"))
                    if on_point is not None:
                        on_point(event["record"])
                elif kind == "error":
                    return DistributedError.of_rank(int(event.get("rank", -1)), str(event.get("message")),
                                            str(event.get("details", ""))), False
                elif kind == "done":
                    return None, True
        elif process.poll() is not None:
            return None, False
        if time.monotonic() - last_news > timeout_s:
            return DistributedError(f"no progress from the MPI ranks for {timeout_s:g} s (a hung rank?); "
                               "mpiexec and every rank were stopped (raise --timeout for very large sizes)"), False


def _parse_event(line: bytes) -> dict[str, Any] | None:
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


def _wait_quietly(process: subprocess.Popen, timeout_s: float) -> None:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the job's process group, SIGKILL after `grace_s`; reaps mpiexec."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(process, signal.SIGKILL)  # stragglers in the group (a rank that ignored SIGTERM)
    _wait_quietly(process, 5.0)


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
