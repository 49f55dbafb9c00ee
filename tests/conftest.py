"""Shared test setup: a private GEMM-rate cache, a CLI runner, free ports, a real Ctrl-C to a sweep."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["STEPSCOPE_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture):
    """Run `stepscope ARGS` in-process; returns (exit code, stdout, stderr)."""
    from stepscope.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse errors
            code = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


STEPSCOPE = [sys.executable, "-m", "stepscope"]
REPO = Path(__file__).resolve().parents[1]


def subprocess_env() -> dict[str, str]:
    """The environment of a `stepscope` child process: this checkout's sources first."""
    return dict(os.environ, PYTHONPATH=str(REPO / "src"))


def interrupt_sweep(argv: list[str], records: Path, after_lines: int, cwd: Path,
                    env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start a real `stepscope` sweep (`env`: variables added to its environment), send it SIGINT once
    `records` holds `after_lines` lines, and return (exit code, stderr). The sweep never outlives the test,
    whatever happens."""
    # a runner that starts jobs in the background (nohup, some CI shells) makes SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler in the child: restore the default so Ctrl-C means Ctrl-C
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**subprocess_env(), **(env or {})}, cwd=cwd,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (records.exists() and records.read_text().count("\n") >= after_lines):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode()
