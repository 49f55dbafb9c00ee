"""The launcher: real gloo process groups on spawned ranks; failing or dying ranks never hang the parent."""

import multiprocessing
import os
import time

import pytest

from stepscope.dist.launch_env import MAX_RANKS_PER_CORE, OVERSUBSCRIBE_ENV, check_local_world
from stepscope.dist.launcher import DistributedError, LaunchConfig, external_launch_env, launch, resolve_backend
from stepscope.errors import UsageError


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
    import torch
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
    monkeypatch.setattr("stepscope.results.environment.usable_cores", lambda: 1)
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
