"""strace as the tracer beneath the API: is it here and permitted, the command line, and its per-thread output.

Why strace (and not `perf trace`): it stops the traced thread at every system call (ptrace), so no call is ever
lost and each one carries its thread, its duration (`-T`) and its file descriptor's type (`-y`: socket, pipe,
file); `perf trace` reads a ring buffer that drops events under load and needs perf_event permissions that
containers often withhold. The price is overhead per call, which is why every traced run is reported beside
the same run untraced.

    strace = find_strace()                        # UsageError (one line) when absent or not permitted
    argv = strace_command(strace, "/tmp/x/t", [sys.executable, "-m", "module", "plan.json"])
    threads = read_threads("/tmp/x/t")            # one ThreadTrace per file t.<tid>
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from stepscope.errors import DistributedError, UsageError

STRACE_FLAGS = ("-f", "-ff", "-ttt", "-T", "-y", "-qq", "-s", "0")
"""Follow children and threads (-f), one output file per thread (-ff), epoch timestamps (-ttt), time spent in
each call (-T), file descriptors decorated with what they are (-y), no attach/exit chatter (-qq), no buffer
contents (-s 0: strace would copy up to 32 bytes of every buffer otherwise)."""

_LINE = re.compile(r"^(\d+\.\d+) (\w+)\((.*)\)\s+= (-?\w+|\?)(?: ([A-Z]\w+))?.*?(?: <(\d+\.\d+)>)?$")
_STAMP = re.compile(r"^(\d+\.\d+) ")
_CLONE = re.compile(r"^(clone3?|fork|vfork)$")
_EXEC = re.compile(r'^"([^"]*)"')


@dataclass
class Syscall:
    """One completed system call of one thread."""

    ts: float
    """Entry time, seconds since the epoch."""
    name: str
    args: str
    """The argument text as strace printed it (buffers elided)."""
    ret: int | None
    """Return value (None for `?`: the thread ended inside the call)."""
    error: str | None
    """errno name of a failed call (ENOENT, EAGAIN, ...)."""
    dur_s: float
    """Time inside the call (0 when strace printed none)."""


@dataclass
class ThreadTrace:
    """Every system call of one thread, and the threads and processes it created."""

    tid: int
    calls: list[Syscall] = field(default_factory=list)
    children: list[tuple[int, bool]] = field(default_factory=list)
    """(tid, is a thread of this process) for each clone/fork that succeeded."""
    exe: str | None = None
    """Program this thread exec'd (its path), if it did."""
    first_ts: float = 0.0
    """Time of its first line (its first call: it was created just before)."""
    last_ts: float = 0.0
    """Time of its last line: its last call's end, or the `+++ killed +++` line of a thread killed inside a call."""


def find_strace() -> str:
    """strace's path, once proven to trace a child here; else UsageError saying what is missing."""
    path = shutil.which("strace")
    if path is None:
        raise UsageError("no system-call tracer here: strace is not installed (apt-get install strace)")
    try:
        probe = subprocess.run([path, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"strace cannot run here: {error}") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        raise UsageError(f"strace is not permitted here ({reason}); tracing needs ptrace: run as a user allowed "
                         "to (kernel.yama.ptrace_scope, a container's SYS_PTRACE capability)")
    return path


def strace_command(strace: str, prefix: str | os.PathLike, argv: list[str]) -> list[str]:
    """`argv` under strace, each thread's calls written to `<prefix>.<tid>`."""
    return [strace, *STRACE_FLAGS, "-o", str(prefix), "--", *argv]


def trace_program(strace: str, prefix: str | os.PathLike, argv: list[str], *, timeout_s: float,
                  what: str) -> dict[int, ThreadTrace]:
    """Run `argv` under strace with window marks switched on (`windows.MARK_ENV`), output under `prefix`; every
    thread's trace. DistributedError (naming `what`) when the program fails or outlives `timeout_s`."""
    from stepscope.distributed.tracing.windows import MARK_ENV

    env = {**os.environ, MARK_ENV: "1"}
    try:  # the program bounds its own waits; this bound is for strace itself
        done = subprocess.run(strace_command(strace, prefix, argv), env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DistributedError(f"the traced run of {what} did not finish within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise DistributedError(f"the traced run of {what} failed: {tail}")
    return read_threads(prefix)


def parse_line(line: str) -> Syscall | None:
    """One line of `strace -ttt -T` output as a Syscall; None for signals, exits and anything unfinished."""
    match = _LINE.match(line.rstrip("\n"))
    if match is None:
        return None
    ts, name, args, ret, error, dur = match.groups()
    value: int | None
    if ret == "?":
        value = None
    else:
        try:
            value = int(ret, 0)
        except ValueError:
            return None
    return Syscall(float(ts), name, args, value, error, float(dur) if dur else 0.0)


def read_thread(path: Path, tid: int) -> ThreadTrace:
    """The calls of one `-ff` output file, with the threads and processes this thread created."""
    thread = ThreadTrace(tid)
    with open(path, errors="replace") as handle:
        for line in handle:
            stamp = _STAMP.match(line)
            if stamp is None:
                continue
            seen = float(stamp.group(1))
            thread.first_ts = thread.first_ts or seen
            thread.last_ts = max(thread.last_ts, seen)
            call = parse_line(line)
            if call is None:
                continue
            thread.last_ts = max(thread.last_ts, call.ts + call.dur_s)
            thread.calls.append(call)
            if _CLONE.match(call.name) and call.ret is not None and call.ret > 0:
                thread.children.append((call.ret, "CLONE_THREAD" in call.args))
            elif call.name == "execve" and call.ret == 0:
                exe = _EXEC.match(call.args)
                thread.exe = exe.group(1) if exe else thread.exe
    return thread


def read_threads(prefix: str | os.PathLike) -> dict[int, ThreadTrace]:
    """Every thread's trace written under `prefix` (files `<prefix>.<tid>`), by tid."""
    prefix = Path(prefix)
    threads = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        suffix = path.name[len(prefix.name) + 1:]
        if suffix.isdigit():
            threads[int(suffix)] = read_thread(path, int(suffix))
    return threads


def process_of(threads: dict[int, ThreadTrace]) -> dict[int, int]:
    """tid -> the pid of its process (thread group), from the clone calls that created each thread."""
    parent: dict[int, tuple[int, bool]] = {}
    for thread in threads.values():
        for child, is_thread in thread.children:
            parent[child] = (thread.tid, is_thread)

    def group(tid: int) -> int:
        seen = 0
        while tid in parent and parent[tid][1] and seen < 1_000_000:  # a thread belongs to its creator's process
            tid, seen = parent[tid][0], seen + 1
        return tid

    return {tid: group(tid) for tid in threads}
