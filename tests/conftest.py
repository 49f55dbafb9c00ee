"""Shared test setup: a private GEMM-rate cache, a CLI runner, free ports."""

from __future__ import annotations

import os
import socket
import sys
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
