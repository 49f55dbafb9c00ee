"""The strace layer on a real traced program (no torch, about a second): a child that, inside a marked window,
starts one thread and sends known bytes over a real socket pair in a known number of writes (and sends,
receives and starts a thread outside it); the tally must count exactly what happened inside. Skipped where
strace is absent or not permitted (that path has its own test)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from stepscope.distributed.tracing.strace import find_strace, parse_line, read_threads, strace_command
from stepscope.distributed.tracing.syscall_kinds import moved_bytes, syscall_kind
from stepscope.distributed.tracing.windows import MARK_ENV, find_windows, tally_window
from stepscope.errors import UsageError

WRITES, CHUNK = 7, 1000
CHILD = textwrap.dedent(f"""
    import socket, threading
    from stepscope.distributed.tracing.windows import window_marker
    a, b = socket.socketpair()
    got = []
    reader = threading.Thread(target=lambda: got.append(sum(len(b.recv(1 << 16)) for _ in range({WRITES}))))
    mark = window_marker(0, "demo")
    a.send(b"y" * 3)  # outside the window: never counted
    b.recv(3)
    mark("begin")
    reader.start()
    for _ in range({WRITES}):
        a.send(b"x" * {CHUNK})
        threading.Event().wait(0.02)  # let the reader drain each write: one recv per send
    reader.join()
    mark("end")
    a.send(b"z" * 5)
    b.recv(5)
    threading.Thread(target=lambda: None).start()
    assert got == [{WRITES * CHUNK}], got
""")


def _strace_or_skip() -> str:
    try:
        return find_strace()
    except UsageError as error:
        pytest.skip(str(error))


def test_a_marked_window_counts_exactly_the_calls_made_in_it(tmp_path):
    strace = _strace_or_skip()
    argv = strace_command(strace, tmp_path / "t", [sys.executable, "-c", CHILD])
    done = subprocess.run(argv, env={**os.environ, MARK_ENV: "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    threads = read_threads(tmp_path / "t")
    windows = find_windows(threads)
    assert list(windows) == ["demo"] and list(windows["demo"].ranks) == [0]
    tally = tally_window(threads, windows["demo"])
    kinds = tally["kinds"]
    # first principles: WRITES sends of CHUNK bytes each, all received, by one thread created in the window
    assert kinds["send"]["calls"] == WRITES and kinds["send"]["bytes"] == WRITES * CHUNK
    assert kinds["recv"]["bytes"] == WRITES * CHUNK and kinds["recv"]["calls"] >= 1
    assert kinds["thread"]["calls"] == 1
    assert tally["rank_processes"] == 1 and tally["processes"] == 1
    assert tally["active_threads"] == 2 and tally["rank_tasks"] >= 1
    assert tally["syscalls"]["sendto"]["calls"] == WRITES  # Python's socket.send is sendto(..., NULL, 0)


def test_lines_kinds_and_bytes():
    mmap = parse_line("1700000000.000100 mmap(NULL, 134217728, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) "
                      "= 0x7fa140000000 <0.000042>")
    assert mmap is not None and mmap.ret == 0x7FA140000000 and mmap.dur_s == pytest.approx(42e-6)
    assert syscall_kind(mmap) == "memory" and moved_bytes(mmap, "memory") == 134217728
    writev = parse_line('1700000000.5 writev(7<socket:[123]>, [{iov_base=""..., iov_len=48}], 2) = 4144 <0.00001>')
    assert syscall_kind(writev) == "send" and moved_bytes(writev, "send") == 4144
    pipe = parse_line('1700000000.5 write(16<pipe:[10182]>, ""..., 133) = 133 <0.000023>')
    assert syscall_kind(pipe) == "other"
    failed = parse_line("1700000000.5 futex(0x7fa, FUTEX_WAIT_PRIVATE, 2, NULL) = -1 EAGAIN (Resource temporarily "
                        "unavailable) <0.000019>")
    assert failed.error == "EAGAIN" and failed.ret == -1 and syscall_kind(failed) == "sync"
    killed = parse_line("1700000000.5 futex(0x7fa, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL) = ?")
    assert killed.ret is None and killed.dur_s == 0
    assert parse_line("1700000000.5 +++ killed by SIGKILL +++") is None


def test_no_strace_is_one_usage_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no strace on it
    with pytest.raises(UsageError, match="strace is not installed"):
        find_strace()


def test_a_call_outlasting_its_window_counts_only_its_time_inside():
    """A futex wait entered 0.5 s before a window closes and lasting 2 s counts 0.5 s; a call before the window
    and one after it count nothing (a window of rank 0, one thread, marks made by hand)."""
    from stepscope.distributed.tracing.strace import Syscall, ThreadTrace
    from stepscope.distributed.tracing.windows import RankMarks, Window

    calls = [Syscall(9.0, "sendto", "3<socket:[1]>, \"\"..., 10, 0, NULL, 0", 10, None, 0.1),
             Syscall(10.25, "sendto", "3<socket:[1]>, \"\"..., 40, 0, NULL, 0", 40, None, 0.25),
             Syscall(10.5, "futex", "0x7f, FUTEX_WAIT_PRIVATE, 2, NULL", 0, None, 2.0),
             Syscall(11.5, "sendto", "3<socket:[1]>, \"\"..., 20, 0, NULL, 0", 20, None, 0.1)]
    threads = {7: ThreadTrace(7, calls=calls, first_ts=9.0, last_ts=12.5)}
    window = Window("w", {0: RankMarks(pid=7, tasks=1, spans=[(10.0, 11.0)])})
    kinds = tally_window(threads, window)["kinds"]
    assert kinds["sync"] == {"calls": 1, "time_us": pytest.approx(0.5e6), "bytes": 0, "errors": 0}
    assert kinds["send"] == {"calls": 1, "time_us": pytest.approx(0.25e6), "bytes": 40, "errors": 0}
