"""The launcher: real gloo process groups on spawned ranks; failing or dying ranks never hang the parent."""

import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from stepscope.distributed.launch import LaunchConfig, external_launch_env, launch, resolve_backend
from stepscope.distributed.launch.launcher import START_PAUSE_ENV
from stepscope.distributed.launch.ranks import MAX_RANKS_PER_CORE, OVERSUBSCRIBE_ENV, check_local_world
from stepscope.errors import DistributedError, UsageError
from tests.conftest import STEPSCOPE, subprocess_env


def all_reduce_rank(ctx, offset):
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(ctx.rank + offset)])
    dist.all_reduce(tensor)
    return {"rank": ctx.rank, "sum": tensor.item(), "world": ctx.world_size, "threads": torch.get_num_threads(),
            "backend": ctx.backend, "env_rank": os.environ["RANK"]}


def failing_rank(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError("rank one is broken on purpose")
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here waiting for rank 1: the parent must stop it
    return "unreachable"


def dying_rank(ctx):
    import torch.distributed as dist

    if ctx.rank == 0:
        os._exit(7)  # no Python exception, no message: a crash
    dist.barrier()


def test_ranks_run_with_a_real_process_group():
    results = launch(all_reduce_rank, 10, config=LaunchConfig(world_size=3, threads=1))
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["sum"] == 10 + 11 + 12 and r["world"] == 3 and r["threads"] == 1 for r in results)
    assert all(r["backend"] == "gloo" and r["env_rank"] == str(r["rank"]) for r in results)


def test_a_raising_rank_stops_every_rank_quickly_with_its_message():
    start = time.monotonic()
    with pytest.raises(DistributedError) as failure:
        launch(failing_rank, config=LaunchConfig(world_size=2, teardown_s=2.0))
    assert time.monotonic() - start < 30
    assert failure.value.rank == 1
    assert "ValueError: rank one is broken on purpose" in str(failure.value)
    assert "failing_rank" in failure.value.details  # the traceback tail names the function


def test_a_dying_rank_is_reported():
    start = time.monotonic()
    with pytest.raises(DistributedError, match="rank 0 failed: died \\(exit code 7\\)"):
        launch(dying_rank, config=LaunchConfig(world_size=2, teardown_s=2.0, timeout_s=20))
    assert time.monotonic() - start < 30


def unpicklable_result(ctx):
    import threading

    return threading.Lock()


def test_a_result_that_cannot_be_sent_is_the_ranks_error():
    with pytest.raises(DistributedError, match="rank 0 failed: TypeError: cannot pickle"):
        launch(unpicklable_result, config=LaunchConfig(world_size=1, threads=1))


SLURM_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
               "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID",
               "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def test_backend_choice_and_external_env(monkeypatch):
    assert resolve_backend("auto", 2) == "gloo"  # no GPU here
    with pytest.raises(UsageError, match="needs CUDA GPUs"):
        resolve_backend("nccl", 2)
    with pytest.raises(UsageError, match="unknown backend"):
        resolve_backend("mpi2", 2)
    for name in SLURM_NAMES:  # a test run inside a Slurm job or under torchrun
        monkeypatch.delenv(name, raising=False)
    # an sbatch script run without srun: PROCID 0 and the allocation's task count, but no job step
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")
    assert external_launch_env() is None
    for batch_step in ("batch", "4294967294", "4294967291", "extern"):  # the batch step's id, old and new
        monkeypatch.setenv("SLURM_STEP_ID", batch_step)
        assert external_launch_env() is None, batch_step
    # a task of `srun -n 8` (step 0): one rank of the job
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert external_launch_env() == {"rank": 3, "world_size": 8, "local_rank": 1, "local_world_size": 4}
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "6")  # `srun -n 6` inside an 8-task allocation
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4,2")
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert external_launch_env() == {"rank": 3, "world_size": 6, "local_rank": 1, "local_world_size": 2}
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # `srun -n 1 stepscope ...`: spawns its own ranks
    assert external_launch_env() is None
    monkeypatch.delenv("SLURM_STEP_ID")
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    monkeypatch.delenv("SLURM_NODEID")
    monkeypatch.setenv("SLURM_STEPID", "2")  # the older name of the step id
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "3,2")  # heterogeneous nodes: no crash, the first count
    assert external_launch_env()["local_world_size"] == 3
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert external_launch_env()["rank"] == 2


def test_a_local_world_far_beyond_the_machine_is_refused_before_any_spawn(cli, tmp_path, monkeypatch):
    for name in SLURM_NAMES + (OVERSUBSCRIBE_ENV,):
        monkeypatch.delenv(name, raising=False)
    # a 1-core machine: the limit is 8 ranks (a run-away world, as the old code would start, stays small)
    monkeypatch.setattr("stepscope.host.usable_cores", lambda: 1)
    limit = MAX_RANKS_PER_CORE
    check_local_world(limit)
    start, children = time.monotonic(), len(multiprocessing.active_children())
    with pytest.raises(UsageError, match=f"{limit + 1} local ranks .* the limit is {limit} .* --oversubscribe"):
        launch(all_reduce_rank, 0, config=LaunchConfig(world_size=limit + 1, threads=1))
    assert time.monotonic() - start < 5 and len(multiprocessing.active_children()) == children
    check_local_world(limit + 1, oversubscribe=True)
    # stepscope comm checks its largest world before the first job starts
    out = tmp_path / "never"
    code, stdout, stderr = cli("comm", "--world", f"2,{limit + 1}", "--sizes", "1K", "--out", out)
    assert code == 2 and stderr.count("\n") == 1 and "pass --oversubscribe" in stderr, stderr
    assert stdout == "" and not out.exists() and time.monotonic() - start < 10
    monkeypatch.setenv(OVERSUBSCRIBE_ENV, "1")
    check_local_world(limit + 1)


def _spawned_ranks(parent: int) -> list[int]:
    """Pids of the multiprocessing children of `parent` (the ranks, not the resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _sigint_ignored(pid: int) -> bool | None:
    """Whether `pid` ignores SIGINT (its rank code runs), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if "State:\tZ" in status:
        return None
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_while_ranks_start_is_one_line_exit_130_and_no_rank_left(tmp_path):
    """Ctrl-C while rank 0 still imports torch (it must not print a KeyboardInterrupt traceback), then in
    the parent between the starts of rank 0 and rank 1 (it must not wait on the rank that never started)."""
    env = dict(subprocess_env(), **{START_PAUSE_ENV: "60"})  # rank 1 starts a minute after rank 0
    argv = [*STEPSCOPE, "comm", "--world", "2", "--sizes", "1K", "--iters", "1", "--warmup", "0", "--no-plot",
            "--out", str(tmp_path)]
    # own session: the Ctrl-C below goes to this run's process group only, as a terminal's would; SIGINT's
    # default restored for runners that start jobs with it ignored
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (ranks := _spawned_ranks(proc.pid)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(ranks) == 1, f"rank 0 never started: {ranks}"
        rank0 = ranks[0]
        # Ctrl-C reaches rank 0 at once (it is still starting: python, then torch); the parent reacts late
        os.kill(rank0, signal.SIGINT)
        while _sigint_ignored(rank0) is False and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _sigint_ignored(rank0), "rank 0 died of the Ctrl-C that reached it while it started"
        assert proc.poll() is None and _spawned_ranks(proc.pid) == [rank0]  # rank 1 is not started yet
        os.killpg(proc.pid, signal.SIGINT)  # the parent sleeps between the two starts
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = err.decode()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["stepscope: interrupted; finished points are kept in the record store"], err
    assert _sigint_ignored(rank0) is None  # torn down, not left behind
