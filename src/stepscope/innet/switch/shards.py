"""A switch on several cores: shards 1..N-1 as forked child processes, each serving its own port (slot j of every
job goes to shard j mod N, so shards share no state: each holds only its slots' rows), shard 0 in the calling
process. A shard stops on SIGTERM, when its parent dies (PR_SET_PDEATHSIG), and sends its counters back.

    shards = ShardProcesses(switches[1:], cpus)   # after binding every shard's socket in the parent
    ...                                           # shard 0 serves here
    counters = shards.stop()                      # [(switch counters, {job: counters})] per child shard
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
from typing import Any

from stepscope.innet.switch.server import Switch

STOP_TIMEOUT_S = 5.0


def pin(cpus: tuple[int, ...], index: int) -> None:
    """Run this process on core cpus[index mod len] (no-op without cores or off Linux)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})


class ShardProcesses:
    """Child processes serving `switches` (already bound): shard i + 1 is switches[i]."""

    def __init__(self, switches: list[Switch], cpus: tuple[int, ...]) -> None:
        context = multiprocessing.get_context("fork")  # the children inherit the bound sockets
        self.children: list[tuple[Any, Any]] = []
        for index, switch in enumerate(switches, start=1):
            mine, theirs = context.Pipe()
            child = context.Process(target=_serve_shard, args=(switch, theirs, cpus, index), daemon=True,
                                    name=f"innet-switch-shard{index}")
            child.start()
            theirs.close()
            switch.sock.close()  # the child serves it now
            self.children.append((child, mine))

    def stop(self) -> list[tuple[dict[str, int], dict[int, dict[str, int]]]]:
        """Stop every shard; their counters (a shard that does not answer in time is killed: none)."""
        for child, _ in self.children:
            if child.is_alive():
                os.kill(child.pid, signal.SIGTERM)
        out = []
        for child, pipe in self.children:
            if pipe.poll(STOP_TIMEOUT_S):
                out.append(pipe.recv())
            child.join(STOP_TIMEOUT_S)
            if child.is_alive():
                child.kill()
            pipe.close()
        return out


def _serve_shard(switch: Switch, pipe: Any, cpus: tuple[int, ...], index: int) -> None:
    _die_with_parent()
    pin(cpus, index)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    try:
        switch.serve_forever(stop)
    finally:
        pipe.send((dict(switch.counters), switch.job_counters()))
        pipe.close()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent goes
    except (OSError, AttributeError):
        pass


def merge(runs: list[tuple[dict[str, int], dict[int, dict[str, int]]]]) -> tuple[dict[str, int],
                                                                             dict[int, dict[str, int]]]:
    """Counters of several shards as one switch's: totals and every job's counters summed."""
    totals: dict[str, int] = {}
    jobs: dict[int, dict[str, int]] = {}
    for counters, job_counters in runs:
        for name, value in counters.items():
            totals[name] = totals.get(name, 0) + value
        for job_id, counts in job_counters.items():
            into = jobs.setdefault(job_id, {})
            for name, value in counts.items():
                into[name] = into.get(name, 0) + value
    return totals, jobs
