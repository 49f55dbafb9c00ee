"""Run the independent pieces of a tiled kernel on CPU worker threads, each issuing single-threaded ops.

Why not let every PyTorch op use the intra-op thread pool, as usual? A tiled kernel issues thousands
of small ops, and each parallel op ends in a barrier where all threads wait for the slowest: when other
processes share the cores (the normal case on a busy machine), every barrier can wait a scheduler time
slice, and the kernel slows down several-fold. PyTorch's own fused CPU attention has one parallel region
per call. Here the work is cut into tasks (head groups, or tiles of one head), `workers` Python threads
pick tasks as they free up, and every op inside runs on one thread (PyTorch releases the GIL inside ops,
so the threads do run in parallel): no barrier until the very end.

`torch.set_num_threads` is process-wide: while a parallel section runs, other Python threads of the
process also see one intra-op thread. The previous setting is restored afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import torch

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def cpu_workers(device: torch.device) -> int:
    """Worker threads for a kernel on `device`: PyTorch's intra-op thread count on CPU, else 1.

    1 while torch.profiler records: it only sees the ops and allocations of the threads it was started
    in, so `stepscope profile` and `stepscope memory` would miss the kernel's work on worker threads.
    """
    if device.type != "cpu" or torch._C._autograd._profiler_enabled():
        return 1
    return torch.get_num_threads()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != workers:
            if _pool is not None:
                _pool.shutdown(wait=True)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stepscope-kernel")
            _pool_size = workers
        return _pool


def _without_grad(task: Callable[[], None]) -> Callable[[], None]:
    """Grad mode is per thread and on by default: kernel tasks must not record autograd graphs."""

    def run() -> None:
        with torch.no_grad():
            task()

    return run


def run_tasks(tasks: Sequence[Callable[[], None]], workers: int) -> None:
    """Run every task; in parallel on `workers` threads with single-threaded ops when workers > 1.

    Tasks are started in the given order (put the longest first for a good balance). The first
    exception of any task is raised once no task runs any more; on Ctrl-C the queued tasks are dropped.
    """
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            _without_grad(task)()
        return
    executor = _executor(workers)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    futures = []
    try:
        futures = [executor.submit(_without_grad(task)) for task in tasks]
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:
        for future in futures:  # after a failure or Ctrl-C: drop what has not started, let the rest finish
            future.cancel()
        wait(futures)
        torch.set_num_threads(previous)
    for future in futures:
        if not future.cancelled() and future.exception() is not None:
            raise future.exception()


def split_evenly(total: int, parts: int) -> list[slice]:
    """`parts` contiguous slices covering range(total), sizes differing by at most one."""
    parts = max(1, min(parts, total))
    bounds = [total * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]
