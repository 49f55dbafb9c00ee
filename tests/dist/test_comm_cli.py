"""`stepscope comm` on real gloo process groups: every op correct on 2 and 3 ranks with torch.profiler
tallies (one spawn per world size), a failing rank, and bad input that never starts a rank."""

import sys
import time

import pytest

from stepscope.dist.collectives import busbw_factor
from stepscope.dist.comm_rank import FAIL_RANK_ENV
from stepscope.results.store import read_records

# torch's API has only one form of these: the other placement is an `unsupported` row
TORCH_UNSUPPORTED = {("all_reduce", False), ("broadcast", False), ("reduce", False), ("all_to_all", True)}


def test_every_op_is_correct_on_2_and_3_ranks_with_tallies(cli, tmp_path):
    out = tmp_path / "r"
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--world", "2,3", "--op", "all", "--sizes", "1000,64K",
                               "--mode", "per-op,batch", "--iters", "3", "--warmup", "1", "--fit", "--tally",
                               "--out", out, "--timeout", "60")
    assert code == 0, stderr
    records = read_records(out / "comm.jsonl")
    points = [r for r in records if r["config"]["record"] == "point"]
    # 6 sized ops x 2 sizes x 2 modes x 2 placements + 2 barriers, per world size
    assert len(points) == 2 * (6 * 2 * 2 * 2 + 2)
    for record in points:
        config, metrics = record["config"], record["metrics"]
        if config["op"] != "barrier" and (config["op"], config["in_place"]) in TORCH_UNSUPPORTED:
            assert record["status"] == "unsupported" and record["note"], config
            continue
        assert record["status"] == "ok" and metrics["wrong"] == 0, (config, record.get("note"))
        assert metrics["time_us_max"] >= metrics["time_us_mean"] >= metrics["time_us_min"] > 0
        assert record["env"]["world_size"] == config["world_size"] and len(record["env"]["ranks"]) == config["world_size"]
        if config["op"] == "barrier":
            assert metrics["busbw_GBps"] is None
            continue
        algbw = config["size_bytes"] / 1e9 / (metrics["time_us_max"] * 1e-6)
        assert metrics["algbw_GBps"] == pytest.approx(algbw)
        assert metrics["busbw_GBps"] == pytest.approx(algbw * busbw_factor(config["op"], config["world_size"]))
    gathered = [p for p in points if p["config"]["op"] == "all_gather" and p["config"]["world_size"] == 3]
    assert {p["config"]["size_bytes"] for p in gathered} == {996, 65532}  # rounded down to 3 equal chunks
    assert "all_gather on 3 ranks: 1000 B rounded down to 996 B" in stdout
    assert "gloo reduce_scatter | 3 ranks | fp32 | batch" in stdout
    assert "unsupported: gloo all_reduce out-of-place fp32: torch.distributed.all_reduce works in place only" in stdout
    fits = [r for r in records if r["config"]["record"] == "fit"]
    assert len(fits) == 2 * 2 * 8  # worlds x modes x (op, placement) pairs measured
    assert all(f["metrics"]["alpha_us"] >= 0 and "beta_GBps" in f["metrics"] for f in fits)
    assert "α–β fit" in stdout and (out / "comm.png").read_bytes()[:4] == b"\x89PNG"
    # three tally tables per measured point, from torch.profiler, merged over the ranks
    measured = sum(p["status"] == "ok" for p in points)
    assert stdout.count("host API calls |") == stdout.count("memory traffic |") == measured
    assert stdout.count("no device activity: CPU-only run (gloo moves data with host threads)") == measured
    for name in ("gloo:all_reduce", "c10d::allreduce_", "gloo:all_gather input", "c10d::barrier", "gloo:all_to_all"):
        assert name in stdout
    assert "| 1 host(s) | 3 process(es) |" in stdout


def test_a_failing_rank_ends_the_command_with_its_message(cli, tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_RANK_ENV, "1")
    start = time.monotonic()
    code, _, stderr = cli("comm", "--backend", "gloo", "--world", "2", "--sizes", "1K", "--no-plot",
                          "--out", tmp_path, "--timeout", "20")
    assert code == 1 and time.monotonic() - start < 30
    assert "rank 1 failed: RuntimeError: injected failure on rank 1" in stderr


@pytest.mark.parametrize("args, message", [
    (["--backend", "nccl"], "backend nccl needs CUDA GPUs"),
    (["--backend", "horovod"], "pip install horovod"),
    (["--backend", "oneccl"], "oneccl_bind_pt"),
    (["--backend", "tcp"], "unknown backend 'tcp'"),
    (["--op", "allreduce"], "invalid choice 'allreduce'"),
    (["--sizes", "1K:1M:x1"], "factor in size range"),
    (["--sizes", "12Q"], "invalid size '12Q'"),
    (["--world", "0"], "invalid value '0' in --world"),
    (["--op", "broadcast", "--root", "2"], "--root 2 is not a rank"),
    (["--iters", "5,6"], "--iters takes one value"),
    (["--dtype", "fp8"], "invalid choice 'fp8'"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(cli, tmp_path, args, message):
    out = tmp_path / "never"
    code, stdout, stderr = cli("comm", *args, "--out", out)
    assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr
    assert not out.exists()


def test_mpi_without_mpi4py_says_how_to_install(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # how Python blocks an import: find_spec sees no module
    code, _, stderr = cli("comm", "--backend", "mpi", "--out", tmp_path / "never")
    assert code == 2 and "pip install 'stepscope[mpi]'" in stderr and stderr.count("\n") == 1
