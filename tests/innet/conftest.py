"""Shared pieces of the innet tests: an in-process switch thread and worker threads with a deadline, and the
data paths (`wire.fastpath`) a test runs on: numpy, and C where the extension is built (else that case is skipped,
with the reason, in pytest's summary)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.wire import fastpath
from stepscope.innet.worker.client import InnetJob
from stepscope.innet.worker.config import JobConfig

DATA_PATHS = ["numpy", pytest.param("c", marks=pytest.mark.skipif(
    fastpath.C is None, reason=f"the C fast path is not built: {fastpath.NOT_BUILT}"))]


@pytest.fixture(params=DATA_PATHS)
def data_path(request: pytest.FixtureRequest) -> str:
    """'numpy' and 'c': a test taking this runs on both paths."""
    return request.param


@pytest.fixture
def switch():
    """A real switch on a UDP port the OS picked, served by a thread of this process."""
    with Switch(SwitchConfig(port=0)) as running:
        yield running


def address(switch: Switch) -> str:
    return f"127.0.0.1:{switch.address[1]}"


def run_ranks(world: int, body: Callable[[int], Any], timeout_s: float = 30.0) -> list[Any]:
    """`body(rank)` on one thread per rank; re-raises the first failure; never waits past the deadline."""
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=target, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in threads), f"ranks still running after {timeout_s} s"
    if errors:
        raise errors[0]
    return results


def job(switch: Switch, rank: int, world: int, job_id: int = 11, **options: Any) -> InnetJob:
    options.setdefault("timeout_s", 10.0)
    config = JobConfig(switch=address(switch), job_id=job_id, rank=rank, world=world, **options)
    return InnetJob(config, log=lambda _: None).join()
