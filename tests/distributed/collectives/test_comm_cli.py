"""`stepscope comm` on real gloo process groups: every op correct on 2 and 3 ranks with torch.profiler
tallies (one spawn per world size), a failing rank, and bad input that never starts a rank."""

import sys
import time

import pytest

from stepscope.distributed.collectives.ops import busbw_factor
from stepscope.distributed.collectives.rank import FAIL_RANK_ENV
from stepscope.results.store import read_records

# torch's API has only one form of these: the other placement is an `unsupported` row
TORCH_UNSUPPORTED = {("all_reduce", False), ("broadcast", False), ("reduce", False), ("all_to_all", True),
                     ("all_to_allv", True)}


def test_every_op_is_correct_on_2_and_3_ranks_with_tallies(cli, tmp_path):
    out = tmp_path / "r"
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--world", "2,3", "--op", "all", "--sizes", "1000,64K",
                               "--mode", "per-op,batch", "--iters", "3", "--warmup", "1", "--fit", "--tally",
                               "--out", out, "--timeout", "60")
    assert code == 0, stderr
    records = read_records(out / "comm.jsonl")
    points = [r for r in records if r["config"]["record"] == "point"]
    # 7 sized ops (all_to_allv at the default skew) x 2 sizes x 2 modes x 2 placements + 2 barriers, per world size
    assert len(points) == 2 * (7 * 2 * 2 * 2 + 2)
    for record in points:
        config, metrics = record["config"], record["metrics"]
        if config["op"] != "barrier" and (config["op"], config["in_place"]) in TORCH_UNSUPPORTED:
            assert record["status"] == "unsupported" and record["note"], config
            continue
        assert record["status"] == "ok" and metrics["wrong"] == 0, (config, record.get("note"))
        assert metrics["time_us_max"] >= metrics["time_us_mean"] >= metrics["time_us_min"] > 0
        world = config["world_size"]
        assert record["env"]["world_size"] == world and len(record["env"]["ranks"]) == world
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
    # two sizes fit any α–β line exactly: no fit is stored, each group says why
    assert not [r for r in records if r["config"]["record"] == "fit"] and "α–β fit:" not in stdout
    assert stdout.count("needs at least 3 sizes, has 2") == 2 * 2 * 9  # worlds x modes x (op, placement) pairs
    assert (out / "comm.png").read_bytes()[:4] == b"\x89PNG"
    # three tally tables per measured point, from torch.profiler, merged over the ranks
    measured = sum(p["status"] == "ok" for p in points)
    assert stdout.count("host API calls |") == stdout.count("memory traffic |") == measured
    assert stdout.count("no device activity: CPU-only run (gloo moves data with host threads)") == measured
    for name in ("gloo:all_reduce", "c10d::allreduce_", "gloo:all_gather input", "c10d::barrier", "gloo:all_to_all"):
        assert name in stdout
    assert "| 1 host(s) | 3 process(es) |" in stdout


SLURM_AND_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID",
                      "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID")


def test_resume_fits_and_plots_the_whole_sweep_in_an_sbatch_script(cli, tmp_path, monkeypatch):
    for name in SLURM_AND_TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    # an sbatch script without srun: Slurm sets PROCID 0 and the allocation's task count, but no job step,
    # so the ranks are spawned here (--world), not awaited from peers that never come
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    out = tmp_path / "r"
    common = ("--world", "2", "--op", "all_reduce,all_gather", "--iters", "2", "--warmup", "1", "--timeout", "30",
              "--out", out)
    start = time.monotonic()
    code, _, stderr = cli("comm", "--backend", "gloo", "--sizes", "1K,4K", "--no-plot", *common)  # interrupted
    assert code == 0 and time.monotonic() - start < 60, stderr
    plotted = []
    monkeypatch.setattr("stepscope.distributed.collectives.plot.plot_comm",
                        lambda records, path, title=None: plotted.extend(records))
    code, stdout, stderr = cli("comm", "--backend", "auto", "--sizes", "1K,4K,16K", "--resume", "--fit", *common)
    assert code == 0, stderr
    assert "backend auto: gloo (nccl needs one GPU per rank" in stdout  # no GPU here
    assert "skipped 8 point(s) of gloo on 2 ranks" in stdout  # 2 ops x 2 sizes x out/in
    assert "fit and plot use 12 point(s) of this sweep: 8 from earlier runs" in stdout
    fits = [r for r in read_records(out / "comm.jsonl") if r["config"]["record"] == "fit"]
    groups = {(f["config"]["op"], f["config"]["in_place"]) for f in fits}
    assert groups == {("all_reduce", True), ("all_gather", False), ("all_gather", True)} and len(fits) == 3
    for fit in fits:  # old and new points: 1K and 4K from the first run, 16K from this one
        assert fit["metrics"]["points"] == 3 and fit["config"]["backend"] == "gloo"
        assert (fit["config"]["size_min_bytes"], fit["config"]["size_max_bytes"]) == (1024, 16384)
    drawn = {(r["config"]["op"], r["config"]["size_bytes"]) for r in plotted if r["config"]["record"] == "point"
             and r["status"] == "ok"}
    assert drawn == {(op, size) for op in ("all_reduce", "all_gather") for size in (1024, 4096, 16384)}
    assert sum(r["config"]["record"] == "fit" for r in plotted) == 3
    # the sweep is complete: a rerun measures nothing, fits the same 12 points, stores no duplicate fit
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--sizes", "1K,4K,16K", "--resume", "--fit", *common)
    assert code == 0 and "skipped 12 point(s)" in stdout and "α–β fit:" in stdout, stderr
    assert sum(r["config"]["record"] == "fit" for r in read_records(out / "comm.jsonl")) == 3


def test_a_rendezvous_that_never_completes_is_one_line(cli, tmp_path, monkeypatch):
    import torch.distributed as dist

    from tests.conftest import free_port

    for name in SLURM_AND_TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    # rank 0 of a 2-rank torchrun job whose other rank never starts
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    start = time.monotonic()
    code, _, stderr = cli("comm", "--sizes", "1K", "--timeout", "2", "--no-plot", "--out", tmp_path)
    assert code == 1 and stderr.count("\n") == 1 and time.monotonic() - start < 30, stderr
    assert "rank 0 of 2: no process group formed at 127.0.0.1:" in stderr
    assert "MASTER_ADDR/MASTER_PORT" in stderr and "all 2 ranks were started" in stderr
    assert not dist.is_initialized()


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
    (["--sizes", "100000000T"], "more than any buffer can hold"),
    (["--world", "0"], "invalid value '0' in --world"),
    (["--op", "broadcast", "--root", "2"], "--root 2 is not a rank"),
    (["--iters", "5,6"], "--iters takes one value"),
    (["--dtype", "fp8"], "invalid choice 'fp8'"),
    (["--op", "all_to_allv", "--skew", "-1"], "--skew"),
    (["--op", "all_to_allv", "--skew", "0,9"], "--skew takes values from 0 (equal split) to 8"),
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
