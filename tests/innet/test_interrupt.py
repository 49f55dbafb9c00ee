"""Ctrl-C, as a terminal sends it (SIGINT to the whole foreground process group): the standalone switch
prints every job's counters and exits 130; a command with its own helper switch keeps its finished records
and exits 130 without a traceback, its switch untouched by the SIGINT and stopped by the command; and a
helper switch whose command dies without stopping it stops by itself."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

from stepscope.innet.wire import protocol as p
from stepscope.results.store import read_records
from tests.conftest import STEPSCOPE, subprocess_env


def _children(pid: int) -> dict[int, str]:
    """Command lines of the live child processes of `pid` (Linux /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
    return out


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited; its parent (gone too) has not reaped it yet
            return True
        time.sleep(0.05)
    return False


def _interrupt_group(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=timeout_s)
    return out, err


def test_ctrl_c_stops_the_standalone_switch_with_its_counter_table(tmp_path):
    proc = subprocess.Popen([*STEPSCOPE, "innet", "switch", "--port", "0", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
                            start_new_session=True)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("innet switch listening on 127.0.0.1:"), ready
        port = int(ready.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # one job of one rank, one block
            sock.settimeout(10)
            sock.connect(("127.0.0.1", port))
            sock.send(p.pack(p.JOIN, 4242, 0, 0, 0, 0, 1, 0, values=p.JoinParams(4, 2, 16, 8).to_values()))
            assert p.unpack(sock.recv(65_536)).type == p.JOINED
            sock.send(p.pack(p.DATA, 4242, 1, 0, 0, 0, 1, 0, values=np.arange(4, dtype=np.int32)))
            assert p.unpack(sock.recv(65_536)).type == p.RESULT
        out, err = _interrupt_group(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "innet switch: 1 job(s) served" in out and "4242" in out and "switch totals: rx 2," in out
    assert "Traceback" not in err
    records = read_records(tmp_path / "innet-switch.jsonl")
    assert [r["config"]["job"] for r in records] == ["4242", None] and records[0]["metrics"]["ok"] == 1


def test_ctrl_c_reaches_the_command_not_its_helper_switch(tmp_path):
    sizes = ",".join(f"{4 * i}K" for i in range(1, 13))
    argv = [*STEPSCOPE, "innet", "bench", "--world", "2", "--sizes", sizes, "--mode", "per-op", "--no-gloo",
            "--warmup", "0", "--iters", "100", "--pipes", "1", "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
                            start_new_session=True)
    records = tmp_path / "innet-bench.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not (
                records.exists() and records.read_text().count("\n") >= 1):
            time.sleep(0.05)
        switches = {pid: line for pid, line in _children(proc.pid).items() if "innet switch" in line}
        assert len(switches) == 1, switches
        [switch_pid] = switches
        assert os.getpgid(switch_pid) != os.getpgid(proc.pid)  # outside the group a terminal's Ctrl-C reaches
        out, err = _interrupt_group(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "stepscope: interrupted; finished points are kept in the record store", err
    kept = read_records(records)
    assert 1 <= len(kept) < 12 and all(r["metrics"]["wrong_elements"] == 0 for r in kept)
    assert _gone(switch_pid)  # stopped by the command, never left behind
    # the switch was stopped by the command (SIGTERM), so it still recorded the job it served
    assert any(r["config"]["job"] and r["metrics"]["ok"] > 0 for r in read_records(tmp_path / "innet-switch.jsonl"))


HOLDER = """
import signal, sys, time
from stepscope.innet.switch.process import SwitchProcess
signal.signal(signal.SIGINT, lambda *_: print("interrupted", flush=True))  # the command survives Ctrl-C too
with SwitchProcess() as switch:
    print(switch.process.pid, switch.address, flush=True)
    time.sleep(120)
"""


def test_a_helper_switch_ignores_the_terminals_ctrl_c_and_never_outlives_its_command():
    from stepscope.innet.switch.process import probe

    holder = subprocess.Popen([STEPSCOPE[0], "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env(), start_new_session=True)
    try:
        pid, address = holder.stdout.readline().split()
        os.killpg(holder.pid, signal.SIGINT)
        assert holder.stdout.readline().strip() == "interrupted"
        time.sleep(0.3)  # a switch that got the SIGINT would be gone by now (it polls every 50 ms)
        assert probe(address)["jobs"] == 0
        holder.kill()  # the command dies without stopping its switch: the switch sees its stdin close
        holder.wait()
        assert _gone(int(pid))
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
