"""`stepscope innet bench --tally syscalls` without a tracer: one line, exit 2, no switch started, nothing written.
(The traced run itself is the comm one's machinery, tested in tests/distributed/collectives/test_comm_syscalls.py
and tests/distributed/tracing.)"""

from __future__ import annotations


def test_bench_without_a_tracer_is_exit_2_and_nothing_written(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without strace
    out = tmp_path / "r"
    code, _, stderr = cli("innet", "bench", "--world", "2", "--sizes", "4K", "--tally", "syscalls", "--out", out)
    assert code == 2 and "strace is not installed" in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()
