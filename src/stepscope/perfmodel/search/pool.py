"""Evaluate a search's chunks on worker processes: numpy's array loops are short at a chunk's size, so the
Python between them holds the GIL most of the time and threads barely help (measured); forked processes do.

The workers are forked after the chunks and their evaluation function are set here, so they inherit both
(and the model's tables) without pickling; only each chunk's small answer comes back. They ignore SIGINT:
Ctrl-C reaches the parent, which stops them. Only on Linux (macOS makes `fork` unsafe once system frameworks
such as Accelerate have run, and Windows has none) and with more than one worker; otherwise the chunks run in
this process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_JOB: tuple[Callable[[Any], Any], Sequence[Any]] | None = None  # what forked workers run, set before the fork


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(index: int) -> Any:
    assert _JOB is not None
    run, chunks = _JOB
    return run(chunks[index])


def pool_size(workers: int, chunks: int) -> int:
    """Processes that `map_chunks` uses for `chunks` chunks: at most one per chunk, one off Linux."""
    if not sys.platform.startswith("linux"):
        return 1
    return max(1, min(workers, chunks))


def map_chunks(run: Callable[[Any], Any], chunks: Sequence[Any], workers: int) -> Iterator[Any]:
    """`run(chunk)` for every chunk, in order, on `pool_size(workers, len(chunks))` processes (this one if 1)."""
    global _JOB
    workers = pool_size(workers, len(chunks))
    if workers <= 1:
        yield from map(run, chunks)
        return
    _JOB = (run, chunks)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_ignore_sigint)
    try:
        yield from pool.map(_run, range(len(chunks)), chunksize=1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _JOB = None
