"""`stepscope comm --tally syscalls` on real gloo process groups under real strace: the bytes a ring all-reduce
sends are what the algorithm says, on 2 and 3 ranks and two sizes; and without a tracer the command stops with
one line before anything runs or is written."""

from __future__ import annotations

import pytest

from stepscope.distributed.tracing.strace import find_strace
from stepscope.errors import UsageError
from stepscope.results.store import read_records

SIZES = (3072, 49152)  # whole fp32 chunks on 2 and 3 ranks


def _strace_or_skip() -> None:
    try:
        find_strace()
    except UsageError as error:
        pytest.skip(str(error))


def test_ring_all_reduce_sends_what_the_algorithm_says(cli, tmp_path):
    _strace_or_skip()
    out = tmp_path / "r"
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--world", "2,3", "--sizes", ",".join(map(str, SIZES)),
                               "--place", "in", "--iters", "3", "--warmup", "1", "--tally", "syscalls", "--no-plot",
                               "--out", out, "--timeout", "60")
    assert code == 0, stderr
    traced = [r for r in read_records(out / "comm.jsonl") if r["config"]["record"] == "syscalls"]
    assert sorted((r["config"]["world_size"], r["config"]["size_bytes"]) for r in traced) == sorted(
        (n, s) for n in (2, 3) for s in SIZES)
    headers = set()
    calls_per_rank = {}
    for record in traced:
        c, m = record["config"], record["metrics"]
        n, size, iters = c["world_size"], c["size_bytes"], c["iters"]
        sends = m["send_calls"] / iters
        # a ring all-reduce: reduce-scatter then all-gather, n-1 steps each, every rank sending one chunk of S/n
        # per step, so the ranks together send 2(n-1)·S bytes of payload per call, in at least 2(n-1)·n messages;
        # every message carries the transport's fixed header on top
        assert sends >= 2 * (n - 1) * n, (n, size, sends)
        header = (m["send_bytes"] / iters - 2 * (n - 1) * size) / sends
        headers.add(round(header, 6))
        # loopback: every byte sent is received, but each rank's window opens on its own, so a peer's first
        # message (or its header) can be read just before the receiver's mark: at most one message per rank
        assert abs(m["recv_bytes"] - m["send_bytes"]) <= size + 64 * n, (m["recv_bytes"], m["send_bytes"])
        calls_per_rank.setdefault(n, set()).add(sends / n)
        assert m["processes"] >= n + 1 and m["rank_tasks"] >= 2 * n  # launcher + ranks; gloo's threads per rank
        assert m["untraced_time_us"] > 0 and m["traced_time_us"] > 0 and m["overhead_x"] > 0
    assert len(headers) == 1 and 0 <= headers.pop() <= 64, "the header per message must be one small constant"
    # below gloo's segment size the message count does not depend on S, and it grows with the ring's n-1 steps
    assert all(len(v) == 1 for v in calls_per_rank.values()), calls_per_rank
    assert calls_per_rank[3].pop() == pytest.approx(2 * calls_per_rank[2].pop())
    assert "GLOO 2 ranks | 1 Hostnames |" in stdout and "gloo3_send" in stdout


def test_no_tracer_is_exit_2_and_nothing_written(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without strace
    out = tmp_path / "r"
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--world", "2", "--sizes", "1K", "--tally", "syscalls",
                               "--out", out)
    assert code == 2 and "strace is not installed" in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()
