"""`stepscope comm --backend mpi`: real mpiexec and mpi4py ranks: every op correct on 3 ranks with wrapper
tallies and nccl-tests output, a failing rank, a hung rank.

Skipped only where mpi4py is missing (the `mpi` extra is not installed). Where it imports, the extra is meant
to work (`make setup` and CI install it): a missing or broken mpiexec then fails these tests, never skips them.
"""

import subprocess
import sys
import time

import pytest

from stepscope.distributed.collectives.nccl_tests_format import parse_nccl_tests
from stepscope.distributed.collectives.rank import FAIL_RANK_ENV
from stepscope.distributed.launch.mpi import MPI_INSTALL, find_mpiexec, mpiexec_command
from stepscope.results.store import read_records

pytest.importorskip("mpi4py")


def test_the_mpi_extra_starts_ranks():
    """mpi4py imports, so mpiexec must be there and start two mpi4py ranks that see each other."""
    mpiexec = find_mpiexec()
    assert mpiexec is not None, f"mpi4py imports but no mpiexec was found; {MPI_INSTALL}"
    program = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.Get_rank(), c.allreduce(1))"
    ranks = subprocess.run(mpiexec_command(2, sys.executable, "-c", program, mpiexec=mpiexec), capture_output=True,
                           text=True, timeout=120)
    assert ranks.returncode == 0, f"{mpiexec} cannot start mpi4py ranks:\n{ranks.stderr[-2000:]}"
    assert sorted(ranks.stdout.split("\n")[:2]) == ["0 2", "1 2"], ranks.stdout


def test_every_op_on_3_mpi_ranks_with_tallies_in_nccl_tests_format(cli, tmp_path):
    code, stdout, stderr = cli("comm", "--backend", "mpi", "--world", "3", "--op", "all", "--sizes", "1000,64K",
                               "--dtype", "fp32,bf16", "--mode", "per-op,batch", "--iters", "3", "--warmup", "1",
                               "--tally", "--format", "nccl-tests", "--no-plot", "--out", tmp_path, "--timeout", "60")
    assert code == 0, stderr
    points = read_records(tmp_path / "comm.jsonl")
    fp32 = [p for p in points if p["config"]["dtype"] == "fp32"]
    assert len(fp32) == 7 * 2 * 2 * 2 + 2
    for record in fp32:
        config = record["config"]
        if config["op"] == "broadcast" and config["in_place"] is False:
            assert record["status"] == "unsupported" and "in place only" in record["note"]
            continue
        if config["op"] == "all_to_allv" and config["in_place"]:
            assert record["status"] == "unsupported" and "no uneven split" in record["note"]
            continue
        assert record["status"] == "ok" and record["metrics"]["wrong"] == 0, (config, record.get("note"))
        assert record["env"]["backend"] == "mpi" and "mpi_library" in record["env"]
    bf16 = [p for p in points if p["config"]["dtype"] == "bf16"]
    assert bf16 and all(p["status"] == "unsupported" and "no bf16" in p["note"] for p in bf16)
    blocks = parse_nccl_tests(stdout)  # stdout holds the nccl-tests text only
    assert [b.op for b in blocks if b.mode == "per-op"] == ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                           "reduce", "all_to_all", "all_to_allv", "barrier"]
    assert all(b.world_size == 3 and b.backend == "mpi" and b.time_stat == "max" for b in blocks)
    gather = [b for b in blocks if b.op == "all_gather"]
    assert len(gather) == 2 and [r.size_bytes for r in gather[0].rows] == [996, 65532]  # 3 equal chunks
    for table in ("mpi host API calls | 1 host(s) | 3 process(es)", "(timing wrappers)", "mpi device activity",
                  "no device activity: CPU-only run (mpi moves data with host threads)", "mpi memory traffic",
                  "MPI_Allreduce", "MPI_Iallgather", "MPI_Waitall", "MPI_Alltoall send", "MPI_Ialltoallv",
                  "MPI_Ibarrier"):
        assert table in stderr, table
    assert "all_gather on 3 ranks: 1000 B rounded down to 996 B" in stderr


def test_a_failing_mpi_rank_aborts_the_job_with_its_message(cli, tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_RANK_ENV, "2")
    start = time.monotonic()
    code, _, stderr = cli("comm", "--backend", "mpi", "--world", "3", "--sizes", "1K", "--no-plot", "--out", tmp_path)
    assert code == 1 and time.monotonic() - start < 30
    assert "rank 2 failed: RuntimeError: injected failure on rank 2" in stderr


def test_a_hung_mpi_rank_is_stopped_after_the_timeout(cli, tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_RANK_ENV, "1:hang")
    start = time.monotonic()
    code, _, stderr = cli("comm", "--backend", "mpi", "--world", "2", "--sizes", "1K", "--no-plot", "--out", tmp_path,
                          "--timeout", "3")
    assert code == 1 and time.monotonic() - start < 30
    assert "no progress from the MPI ranks for 3 s" in stderr
