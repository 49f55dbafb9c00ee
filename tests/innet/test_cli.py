"""`stepscope innet ...`: bad input is one line and exit 2; each command runs on tiny sizes (real switch
process, real ranks) and appends well-formed records."""

import json
import subprocess

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.innet import InnetJob, JobConfig
from stepscope.innet.wire import fastpath
from stepscope.results.store import read_records
from tests.conftest import STEPSCOPE, subprocess_env
from tests.innet.conftest import run_ranks


@pytest.mark.parametrize("args", [
    ["bench", "--world", "0"], ["bench", "--drop", "1.5"], ["bench", "--sizes", "3"], ["bench", "--mode", "fast"],
    ["bench", "--world", "2", "--straggler", "ranks=5;delay=1s"], ["bench", "--straggler", "delay=soon"],
    ["bench", "-k", "3", "--world", "2"], ["bench", "--switch", "localhost"], ["switch", "--port", "70000"],
    ["bench", "--switch", "127.0.0.1:9"], ["train", "--model", "tiny", "--switch", "127.0.0.1:9"],
    ["simulate", "--workers", "1"], ["simulate", "--link-Gbps", "1000"], ["simulate", "--loss", "x"],
    ["timeout-profile", "--sto-ms", "x"], ["timeout-profile", "--rto-ms", "0"], ["train", "--model", "nope"],
    ["train", "--world", "1"], ["train", "--ddp", "fancy"], ["simulate", "--straggler", "ranks=1;delay=1ms;steps=3-1"],
    ["simulate", "--straggler", "ranks=1;delay=1ms;dist=normal"]])
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args):
    code, out, err = cli("innet", *args, "--out", tmp_path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "error" in err
    assert not list(tmp_path.glob("*.jsonl"))  # nothing was started or written


def test_switch_serves_and_records_on_exit(tmp_path):
    """A real `stepscope innet switch` process serves two ranks' all-reduce, then records what it served."""
    argv = [*STEPSCOPE, "innet", "switch", "--port", "0", "--stop-on-stdin-eof", "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env())
    try:
        ready = proc.stdout.readline()  # the child prints its address first
        assert "innet switch listening on 127.0.0.1:" in ready, proc.stderr.read() if proc.poll() else ready
        port = int(ready.rsplit(":", 1)[1])
        path = fastpath.name(fastpath.resolve())
        assert proc.stdout.readline().startswith(f"innet switch: data path {path}")  # which path serves

        def rank(r):
            config = JobConfig(switch=f"127.0.0.1:{port}", job_id=7, rank=r, world=2, pipes=1, timeout_s=20)
            with InnetJob(config, log=lambda _: None).join() as member:
                return member.all_reduce(np.full(1000, r + 1, np.int32), "sum")

        assert all((result == 3).all() for result in run_ranks(2, rank))
        out, err = proc.communicate(timeout=30)  # closing stdin stops it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "innet switch: 1 job(s) served" in out
    job, totals = read_records(tmp_path / "innet-switch.jsonl")
    assert job["config"]["job"] == "7" and totals["config"]["job"] is None and totals["env"]["hostname"]
    assert job["config"]["data_path"] == totals["config"]["data_path"] == path
    # 1000 values at 64 per packet: 16 blocks, each completed once with both contributions
    assert job["metrics"]["ok"] == 16 and job["metrics"]["bad"] == job["metrics"]["to"] == 0
    assert job["metrics"]["rx"] >= 2 * 16 and job["metrics"]["tx"] >= 2 * 16
    assert totals["metrics"]["switch_bad"] == 0


def test_simulate_prints_bounds_and_counters(cli, tmp_path):
    code, out, err = cli("innet", "simulate", "--op-bytes", "1M", "--sto-ms", "0.05,12.5", "-k", "5", "--out", tmp_path)
    assert code == 0, err
    assert "ideal_innet_algbw_GBps" in out and "ideal_ring_algbw_GBps" in out and "ok / to blocks" in out
    assert "packets/s" in out
    records = read_records(tmp_path / "innet-simulate.jsonl")
    assert len(records) == 2 and all(r["metrics"]["algbw_GBps"] > 0 for r in records)
    assert records[0]["metrics"]["ideal_ring_algbw_GBps"] == pytest.approx(7.5)  # 100 Gb/s, 6 workers


def test_simulate_straggles_only_at_the_given_steps(cli, tmp_path):
    code, out, err = cli("innet", "simulate", "--workers", "2", "--op-bytes", "4K", "--workload", "waited",
                         "--ops", "4", "--stall-prob", "0", "--straggler", "ranks=1;delay=100ms;steps=1",
                         "--out", tmp_path)
    assert code == 0, err
    [record] = read_records(tmp_path / "innet-simulate.jsonl")
    assert record["config"]["straggler_steps"] == [1, 1]
    assert 25 <= record["metrics"]["op_ms_mean"] < 50  # one op of four waits 100 ms for the straggler


def test_bench_checks_every_result_under_loss(cli, tmp_path):
    code, out, err = cli("innet", "bench", "--world", "2", "--sizes", "1K,6000", "--mode", "per-op,batch",
                         "--batch", "2", "--warmup", "1", "--iters", "2", "--check", "--drop", "0.02",
                         "--pipes", "1", "--out", tmp_path)
    assert code == 0, err
    assert "innet_algbw_GBps" in out and "gloo_algbw_GBps" in out
    path = fastpath.name(fastpath.resolve())
    assert f"data path {path} (switch: {path})" in out.splitlines()[0]  # the title says which path ran
    records = read_records(tmp_path / "innet-bench.jsonl")
    assert len(records) == 4
    for record in records:
        metrics = record["metrics"]
        assert metrics["data_path"] == metrics["switch_data_path"] == path
        assert metrics["wrong_elements"] == 0 and metrics["checked_elements"] > 0
        assert metrics["innet_latency_ms_median"] > 0 and metrics["gloo_algbw_GBps"] > 0 and metrics["ok"] > 0
    assert json.dumps(records)  # well-formed
    switch_records = read_records(tmp_path / "innet-switch.jsonl")  # the switch process recorded its job too
    assert any(r["config"]["job"] and r["metrics"]["ok"] > 0 for r in switch_records)


def test_bench_averages_int32_like_gloo(cli, tmp_path):
    code, out, err = cli("innet", "bench", "--world", "2", "--sizes", "1K", "--mode", "per-op", "--warmup", "0",
                         "--iters", "1", "--check", "--dtype", "i32", "--op", "avg", "--out", tmp_path)
    assert code == 0, err
    (record,) = read_records(tmp_path / "innet-bench.jsonl")
    assert record["metrics"]["wrong_elements"] == 0 and record["metrics"]["checked_elements"] == 2 * 256  # both ranks


def test_timeout_profile_prints_dpa_layout_and_applies_the_straggler(cli, tmp_path):
    code, out, err = cli("innet", "timeout-profile", "--world", "2", "--sto-ms", "0.05,5", "--rto-ms", "20,50",
                         "--ops", "3", "--size", "1K", "--straggler", "ranks=1;delay=100ms;steps=0",
                         "--out", tmp_path)
    assert code == 0, err
    assert "STO ms (ticks)" in out and "0.05 (1)" in out and "5 (77)" in out and "3 ops batch" in out
    assert "RTO 50 ms GB/s" in out and "injected straggler: ranks 1 +100 ms" in out
    records = read_records(tmp_path / "innet-timeout-profile.jsonl")
    assert len(records) == 2 * (3 + 1)  # 3 workloads at the first RTO, the waited one at the second
    assert all(r["metrics"]["ok"] + r["metrics"]["to"] > 0 for r in records)
    # rank 1 sleeps 100 ms before each cell's first op: with K = 1 even the 5 ms timeout completes its blocks
    assert all(r["metrics"]["to"] > 0 for r in records if r["config"]["sto_ms"] == 5)
    assert all(r["config"]["job"]["faults"]["straggler"]["delay_s"] == 0.1 for r in records)


def test_train_prints_bucket_lines_and_step_times(cli, tmp_path):
    code, out, err = cli("innet", "train", "--model", "tiny", "--world", "3", "--steps", "1", "--seq", "8",
                         "--straggler", "ranks=1;delay=300ms", "--values-per-packet", "512", "--out", tmp_path)
    assert code == 0, err
    assert "innet: new-task allreduce." in out and "no-straggle" in out and "straggle-2" in out
    assert "replicas identical after training: gloo yes, innet yes" in out
    records = read_records(tmp_path / "innet-train.jsonl")
    # gloo and innet K=3, K=2 (fastest-K below the world: the straggler is left out), without and with it
    assert sorted((r["config"]["backend"], r["config"]["k"]) for r in records) == [
        ("gloo", 3), ("gloo", 3), ("innet", 2), ("innet", 2), ("innet", 3), ("innet", 3)]
    assert all(r["metrics"]["step_ms_median"] > 0 for r in records)


def test_train_takes_fastest_k_as_numbers_or_relative_to_world():
    from stepscope.cli.innet.train import train_config
    from stepscope.cli.main import build_parser

    def ks(k: str) -> tuple[int, ...] | None:
        return train_config(build_parser().parse_args(["innet", "train", "--model", "tiny", "--world", "4",
                                                       "-k", k])).ks

    assert ks("world,world-1,2") == (4, 3, 2)
    assert ks("3,world-1") == (3,)  # duplicates dropped
    with pytest.raises(UsageError):
        ks("world-4")
    with pytest.raises(UsageError):
        ks("everyone")


def test_switch_bench_drives_a_sharded_switch_and_counts_every_packet(cli, tmp_path):
    code, out, err = cli("innet", "switch-bench", "--payload", "64,1K", "--world", "3", "--shards", "1,2",
                         "--duration-s", "0.2", "--warmup-s", "0", "--repeats", "1", "--out", tmp_path)
    assert code == 0, err
    assert "total_pps" in out and "total_GBps" in out
    path = fastpath.name(fastpath.resolve())
    assert f"data path {path} (generator: {path})" in out.splitlines()[0]
    records = [r for r in read_records(tmp_path / "innet-switch.jsonl") if r["config"].get("record") == "bench"]
    assert sorted((r["config"]["payload_bytes"], r["config"]["shards"]) for r in records) == [
        (64, 1), (64, 2), (1024, 1), (1024, 2)]
    for record in records:
        m = record["metrics"]
        assert m["wrong"] == 0 and m["stalled"] == 0 and m["sent"] > 0 and m["switch_data_path"] == path
        assert m["in_packets"] == m["sent"]  # every packet the generator sent reached the switch, and
        assert m["out_packets"] == 3 * m["results"]  # each result went to the 3 ranks (rank 0 counts them)
        assert m["results"] == m["sent"] // 3  # every block completed
        datagram = 32 + record["config"]["payload_bytes"]
        assert m["total_GBps"] == pytest.approx((m["in_pps"] + m["out_pps"]) * datagram / 1e9)


def test_switch_bench_refuses_bad_payloads(cli, tmp_path):
    code, _, err = cli("innet", "switch-bench", "--payload", "6", "--out", tmp_path)
    assert code == 2 and "--payload" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "innet-switch.jsonl").exists()
