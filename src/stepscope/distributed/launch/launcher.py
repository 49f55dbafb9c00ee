"""Run a function on N ranks: local spawned processes, or the current process under torchrun / Slurm.

    results = launch(fn, arg1, arg2, config=LaunchConfig(world_size=4))

`fn(ctx, *args)` runs on every rank with torch.distributed initialized (`ctx` is a `RankContext`);
`launch` returns the per-rank return values in rank order (on the parent; under torchrun on rank 0,
and None on the other ranks).

Never a hang: a rank that raises or dies is reported to the parent, which tears every other rank down
(SIGTERM, then SIGKILL after `teardown_s`) and raises `DistributedError` with the failing rank's error
and the tail of its traceback. Collectives get `timeout_s`, so a rank waiting on a dead peer errors out
too. Local rendezvous goes through a TCPStore the parent owns on a port the OS picks (no port races).
Ctrl-C is the parent's alone (ranks are born with SIGINT blocked, then ignore it): it tears the started
ranks down and lets KeyboardInterrupt through, even half-way through starting them.

Who starts the ranks (torchrun, an srun job step, or this process) and how many may be spawned here:
see `ranks`; the torchrun/Slurm path is `external`, what every rank shares `rank`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from stepscope.distributed.launch.external import launch_external
from stepscope.distributed.launch.rank import LaunchConfig, init_rank, resolve_backend
from stepscope.distributed.launch.ranks import check_local_world, external_launch_env
from stepscope.distributed.launch.teardown import stop_processes
from stepscope.errors import DistributedError, UsageError

START_PAUSE_ENV = "STEPSCOPE_TEST_START_PAUSE_S"
"""Tests only: seconds to wait between two local rank starts (to interrupt a launch half-way, on purpose)."""


def _spawned_rank(rank: int, world_size: int, port: int, config: LaunchConfig, backend: str,
                  fn: Callable[..., Any], args: tuple, results: Any) -> None:
    """Entry point of a locally spawned rank: report ("ok", rank, pickled value) or ("error", rank, time,
    message, traceback tail)."""
    import torch.distributed as dist

    # Ctrl-C is the parent's to handle; it tears us down. This rank started with SIGINT blocked (see
    # `_sigint_held`): ignoring it drops a Ctrl-C held since then, unblocking it gives programs this rank
    # starts the usual signal mask
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        store = dist.TCPStore(config.master_addr, port, world_size=None, is_master=False,
                              timeout=dt.timedelta(seconds=config.timeout_s))
        layout = {"rank": rank, "world_size": world_size, "local_rank": rank, "local_world_size": world_size}
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=config.master_addr, MASTER_PORT=str(port))
        ctx = init_rank(layout, config, backend, store)
        value = fn(ctx, *args)
        # pickled here, not in the queue's feeder thread: a value that cannot be sent is this rank's error,
        # not a silent exit the parent could only report as "died (exit code 0)"
        results.put(("ok", rank, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
    except BaseException as error:  # noqa: BLE001 - every failure must reach the parent
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        message = (traceback.format_exception_only(type(error), error)[-1]).strip()
        results.put(("error", rank, time.time(), message, "".join(lines[-6:])))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a peer may already be gone
                pass


# ---- the parent side -----------------------------------------------------------------------------
def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch(fn: Callable[..., Any], *args: Any, config: LaunchConfig | None = None) -> list[Any] | None:
    """Run `fn(ctx, *args)` on every rank; per-rank results in rank order (see module docstring)."""
    config = config or LaunchConfig()
    external = external_launch_env()
    if external is not None:
        return launch_external(fn, args, config, external)
    if config.world_size < 1:
        raise UsageError(f"world size must be at least 1, got {config.world_size}")
    check_local_world(config.world_size, oversubscribe=config.oversubscribe)
    backend = resolve_backend(config.backend, config.world_size)

    import torch.distributed as dist

    store = dist.TCPStore(config.master_addr, 0, world_size=None, is_master=True,
                          timeout=dt.timedelta(seconds=config.timeout_s), wait_for_workers=False)
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_spawned_rank, name=f"stepscope-rank{rank}", daemon=True,
                                 args=(rank, config.world_size, store.port, config, backend, fn, args, results))
                 for rank in range(config.world_size)]
    values: dict[int, Any] = {}
    errors: dict[int, tuple[float, str, str]] = {}
    deaths: dict[int, str] = {}
    start = time.monotonic()
    try:
        for rank, process in enumerate(processes):
            if rank:
                _pause_between_starts()
            with _sigint_held():
                process.start()
        while len(values) < config.world_size and not errors and not deaths:
            _drain(results, values, errors, timeout=0.1)
            _find_deaths(processes, values, errors, deaths, results)
            if config.deadline_s is not None and time.monotonic() - start > config.deadline_s and not errors:
                late = min(set(range(config.world_size)) - set(values))
                errors[late] = (time.time(), f"did not finish within the {config.deadline_s:g} s deadline", "")
        if errors or deaths:
            # one failure usually makes the other ranks fail too (connection reset by peer): collect them
            # for a moment so the report names the root cause, not an echo of it
            settle = time.monotonic() + 1.0
            while time.monotonic() < settle:
                _drain(results, values, errors, timeout=0.1)
                _find_deaths(processes, values, errors, deaths, results)
    finally:
        done = len(values) == config.world_size and not errors and not deaths
        stop_processes(processes, 0.0 if done else config.teardown_s)
        results.close()
    if deaths:
        rank = min(deaths)
        raise DistributedError.of_rank(rank, f"died ({deaths[rank]})" + _others(len(deaths) + len(errors) - 1))
    if errors:
        rank = min(errors, key=lambda r: errors[r][0])  # the earliest error is the cause
        _, message, details = errors[rank]
        raise DistributedError.of_rank(rank, message + _others(len(errors) - 1), details)
    return [values[rank] for rank in range(config.world_size)]


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Start a rank with SIGINT blocked and hold a Ctrl-C meanwhile (delivered, as usual, on leaving).

    A spawned rank imports torch for a second or two before `_spawned_rank` can ignore SIGINT; a Ctrl-C
    in that time (the terminal sends it to the rank too) would print the rank's KeyboardInterrupt traceback.
    A blocked signal mask survives fork and exec, so the rank holds that Ctrl-C until it ignores it. Here
    the Ctrl-C is only held for the few milliseconds of `start()`, which it would otherwise cut in half
    (a child running that the parent does not know about). CPython's resource tracker does the same."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # when it has to start it, it unblocks SIGINT: not inside the block
    held: list[Any] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    replace = previous is not None and previous is not signal.SIG_IGN
    if replace:  # another thread (the TCPStore's) may take the signal: its Python handler would still raise here
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C pending meanwhile reaches `held` here
        if replace:
            signal.signal(signal.SIGINT, previous)
    if held:
        if callable(previous):
            previous(signal.SIGINT, held[0])  # the default handler raises KeyboardInterrupt
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _pause_between_starts() -> None:
    pause = os.environ.get(START_PAUSE_ENV, "").strip()
    if pause:
        time.sleep(float(pause))


def _others(count: int) -> str:
    return f" (and {count} other rank(s) failed after it)" if count > 0 else ""


def _drain(results: Any, values: dict[int, Any], errors: dict[int, tuple[float, str, str]],
           timeout: float) -> None:
    """Read every queued rank message (waiting up to `timeout` for the first)."""
    while True:
        try:
            message = results.get(timeout=timeout) if timeout > 0 else results.get_nowait()
        except queue.Empty:
            return
        timeout = 0.0
        if message[0] == "ok":
            values[message[1]] = pickle.loads(message[2])
        else:
            errors.setdefault(message[1], (message[2], message[3], message[4]))


def _find_deaths(processes: list[mp.process.BaseProcess], values: dict[int, Any],
                 errors: dict[int, tuple[float, str, str]], deaths: dict[int, str], results: Any) -> None:
    """Ranks that exited without reporting (a crash, os._exit, the OOM killer)."""
    for rank, process in enumerate(processes):
        if rank in values or rank in errors or rank in deaths or process.exitcode is None:
            continue
        _drain(results, values, errors, timeout=0.2)  # its last message may still be in the pipe
        if rank not in values and rank not in errors:
            deaths[rank] = _describe_exit(process.exitcode)


