"""The switch as a real separate process: `run_switch` is what `stepscope innet switch` runs (it serves,
then records every job's counters and its totals, `innet-switch`), and `SwitchProcess` starts that command
as a child on a port the OS picks (bench, train, tests); `probe` asks a running switch for its totals.

The child prints `innet switch listening on HOST:PORT` first; the parent reads that line (with a
timeout), so no port is ever guessed, and keeps reading the child's output on a thread (a full pipe would
block the switch). Stopping sends SIGTERM; the child prints its per-job counters and exits; a child that
does not exit within `stop_timeout_s` is killed. The child also stops when its stdin closes, i.e. when the
parent is gone however it died, so a killed benchmark never leaves a switch behind.

The child runs in its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) reaches
only the command, which stops its ranks, keeps its finished records and then stops the switch itself.
Were the switch in the command's group, it would stop first and the ranks would fail with "nothing listens
on that port" before the command saw its KeyboardInterrupt.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepscope.distributed.launch.teardown import stop_processes
from stepscope.errors import UsageError
from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.switch.shards import ShardProcesses, merge, pin
from stepscope.innet.wire import fastpath
from stepscope.innet.wire import protocol as p
from stepscope.results.environment import base_environment
from stepscope.results.store import RecordStore, make_record

READY_PREFIX = "innet switch listening on "


@dataclass
class SwitchRun:
    """What a switch process did: its global counters and the counters of every job it served."""

    counters: dict[str, int]
    jobs: dict[int, dict[str, int]]
    seconds: float
    interrupted: bool
    data_path: str = "numpy"
    """'c' or 'numpy' (`wire.fastpath`)."""

    def job_rows(self) -> list[dict[str, Any]]:
        """One row per job served: its id (as text: an id, not a number to sum) and its counters."""
        return [{"job": str(job_id), **counters} for job_id, counters in self.jobs.items()]

    def totals(self) -> dict[str, int]:
        """The switch's own counters, named `switch_<counter>`."""
        return {f"switch_{name}": value for name, value in self.counters.items()}


def run_switch(config: SwitchConfig, out: str | os.PathLike | None = None, *, duration_s: float | None = None,
               stats_interval_s: float | None = None, say: Callable[[str], None] | None = None,
               stop_on_stdin_eof: bool = False) -> SwitchRun:
    """Serve until SIGINT/SIGTERM (or `duration_s`, or the end of stdin when `stop_on_stdin_eof`), then
    append one `innet-switch` record per job served and one of the totals to `<out>/innet-switch.jsonl`
    (None: no records); returns the counters. An address it cannot bind is a usage error."""
    config.validate()
    store = RecordStore(out, "innet-switch").check_writable() if out is not None else None
    switches: list[Switch] = []
    try:
        for index in range(config.shards):  # every shard's port bound here: a busy one is bad input
            switches.append(Switch(config.shard(index)))
    except OSError as error:
        for switch in switches:
            switch.sock.close()
        raise UsageError(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}") from None
    addresses = [switch.address for switch in switches]
    shards = ShardProcesses(switches[1:], config.cpus)
    pin(config.cpus, 0)
    try:
        run = _serve(switches[0], addresses, duration_s, stats_interval_s,
                     say or (lambda line: print(line, flush=True)), stop_on_stdin_eof)
    finally:
        others = shards.stop()
    if others:
        run.counters, run.jobs = merge([(run.counters, run.jobs), *others])
    if store is not None:
        _record(store, config, run)
    return run


def _serve(switch: Switch, addresses: list[tuple[str, int]], duration_s: float | None, stats_interval_s: float | None,
           say: Callable[[str], None], stop_on_stdin_eof: bool) -> SwitchRun:
    stop = threading.Event()
    interrupted = {"sigint": False}

    def on_signal(signum: int, _frame: object) -> None:
        interrupted["sigint"] = interrupted["sigint"] or signum == signal.SIGINT
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    say(READY_PREFIX + ",".join(f"{host}:{port}" for host, port in addresses))
    say(f"innet switch: {fastpath.describe(switch.native)}")
    timers = []
    if duration_s is not None:
        timers.append(threading.Timer(duration_s, stop.set))
    if stats_interval_s:
        timers.append(threading.Thread(target=_report_every, args=(switch, stats_interval_s, stop, say)))
    if stop_on_stdin_eof:
        timers.append(threading.Thread(target=_stop_at_eof, args=(stop,)))
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        switch.serve_forever(stop)
    finally:
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        switch.sock.close()
    return SwitchRun(dict(switch.counters), switch.job_counters(), time.monotonic() - start, interrupted["sigint"],
                     fastpath.name(switch.native))


def _record(store: RecordStore, config: SwitchConfig, run: SwitchRun) -> None:
    env = base_environment()
    where = {"host": config.host, "port": config.port,  # as asked (0: the port the OS picked is not kept)
             "shards": config.shards, "data_path": run.data_path}
    for row in run.job_rows():
        store.append(make_record("innet-switch", {**where, "job": row["job"]},
                                 {name: row[name] for name in p.COUNTERS}, env=env))
    store.append(make_record("innet-switch", {**where, "job": None}, {**run.totals(), "served_s": run.seconds},
                             env=env))


def _report_every(switch: Switch, interval_s: float, stop: threading.Event, say: Callable[[str], None]) -> None:
    while not stop.wait(interval_s):
        totals = switch.counters
        say(f"innet switch: {len(switch.jobs)} job(s), rx {totals['rx']}, tx {totals['tx']}, bad {totals['bad']}")


def _stop_at_eof(stop: threading.Event) -> None:
    """Stop once stdin reaches its end: the parent that holds the pipe's other end has exited."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    stop.set()


class SwitchProcess:
    """`stepscope innet switch` as a child process; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1", extra_args: tuple[str, ...] = (), out_dir: str | None = None,
                 start_timeout_s: float = 30.0, stop_timeout_s: float = 5.0) -> None:
        self.host = host
        # its per-job counters go to the run's record folder, or nowhere (never into the current directory)
        self.extra_args = (*extra_args, *(("--out", out_dir) if out_dir else ("--no-records",)))
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.process: subprocess.Popen | None = None
        self.address = ""
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._output: list[str] = []

    @property
    def output(self) -> str:
        """What the child printed besides its ready line (so far)."""
        return "".join(self._output)

    def start(self) -> SwitchProcess:
        command = [sys.executable, "-m", "stepscope", "innet", "switch", "--host", self.host, "--port", "0",
                   "--stop-on-stdin-eof", *self.extra_args]
        # start_new_session: the terminal's Ctrl-C is the command's to handle (see the module docstring)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            self._reader = threading.Thread(target=self._read, args=(self.process.stdout,),
                                            name="innet-switch-output", daemon=True)
            self._reader.start()
            deadline = time.monotonic() + self.start_timeout_s
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    line = self._lines.get(timeout=remaining)
                except queue.Empty:
                    break
                if line is None:  # the child exited
                    break
                if line.startswith(READY_PREFIX):
                    self.address = line[len(READY_PREFIX):].strip()
                    return self
                self._output.append(line)
        except BaseException:  # e.g. Ctrl-C while the switch starts: no context manager will stop it
            self.stop()
            raise
        self.stop()
        raise RuntimeError(f"the innet switch process did not start: {self.output.strip() or 'no output'}")

    def _read(self, stream: Any) -> None:
        """Queue the child's lines until it closes its output (None marks the end)."""
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def stop(self) -> str:
        """Stop the child (SIGTERM, then SIGKILL) and return what it printed after starting."""
        if self.process is None:
            return self.output
        process, self.process = self.process, None
        stop_processes([process], self.stop_timeout_s)
        if self._reader is not None:
            self._reader.join(5.0)  # the child is gone: its output ends
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self._output.append(line)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        return self.output

    def __enter__(self) -> SwitchProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def probe(address: str, timeout_s: float = 2.0) -> dict[str, int]:
    """The totals of the switch at host:port (a STATS request for job 0; shards host:port,...: summed over
    them); UsageError if one does not answer."""
    shards = [_probe_one(part.strip(), timeout_s) for part in address.split(",")]
    return {name: sum(shard.get(name, 0) for shard in shards) for name in shards[0]}


def _probe_one(address: str, timeout_s: float) -> dict[str, int]:
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, int(port)))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                sock.send(p.pack(p.STATS, 0, 0, 0, 0, 0, 0, 0))
                if select.select([sock], [], [], min(0.2, max(0.0, deadline - time.monotonic())))[0]:
                    data = sock.recv(65_536)
                    h = p.unpack(data)
                    if h.type == p.STATS_REPLY and h.job == 0:
                        return p.stats_from_payload(data, h.count, p.SWITCH_COUNTERS)
        except (OSError, ValueError, p.ProtocolError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise UsageError(f"no innet switch answers at {address} ({reason})") from None
    raise UsageError(f"no innet switch answers at {address} within {timeout_s:g} s")

