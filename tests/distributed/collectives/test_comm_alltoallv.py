"""`comm --op all_to_allv`: the skewed split (Zipf popularity, seeded, exact at skew 0), its check
pattern against an independent numpy all-to-all-v, S and busbw as rccl-tests' alltoallv_perf, and the
acceptance run: all_to_all and all_to_allv with #wrong = 0 on 2 and 4 gloo ranks (one spawn per world
size), the nccl-tests text read back, and the same on 4 mpi4py ranks (one mpiexec)."""

import numpy as np
import pytest
import torch

from stepscope.distributed.collectives.nccl_tests_format import import_records, parse_nccl_tests
from stepscope.distributed.collectives.ops import (
    SENTINEL,
    bandwidths_GBps,
    expected_values,
    input_values,
    layout,
)
from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.collectives.rank import timing_metrics
from stepscope.distributed.collectives.splits import imbalance, popularity, split_matrix
from stepscope.results.store import read_records


def _zipf(n, skew):
    weights = [1 / k ** skew for k in range(1, n + 1)]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_split_is_zipf_deterministic_and_equal_at_skew_0(n):
    for skew in (0.0, 0.5, 1.0, 2.0):
        shares = popularity(n, skew, seed=3)
        assert sorted(shares, reverse=True) == pytest.approx(_zipf(n, skew), rel=1e-12)
        send = 1000 * n + 7  # not a multiple of n: leftover elements must still be placed
        splits = split_matrix(send, n, skew, 3)
        assert all(sum(row) == send and min(row) >= 0 for row in splits)
        for row in splits:  # largest remainder: each block within one element of its exact quota
            assert all(abs(count - send * p) < 1 for count, p in zip(row, shares, strict=True))
        assert splits == split_matrix.__wrapped__(send, n, skew, 3)  # recomputed, not the cached object
    assert set(split_matrix(1000 * n, n, 0.0, 5)) == {(1000,) * n}  # exactly all_to_all's split
    assert imbalance(split_matrix(1000 * n, n, 0.0, 5)) == 1.0


def test_skew_raises_imbalance_and_the_seed_picks_the_hot_rank():
    n = 4
    values = [imbalance(split_matrix(4000, n, skew, 0)) for skew in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert values == sorted(values) and values[0] == 1.0 and values[-1] < n
    # every rank sends with the same popularity, so the hottest rank receives n * max(p) of the mean
    assert values[2] == pytest.approx(n * _zipf(n, 1.0)[0], abs=1 / 4000)
    hot = {max(range(n), key=popularity(n, 1.0, seed).__getitem__) for seed in range(20)}
    assert len(hot) > 1  # the hot rank is not always rank 0
    with pytest.raises(ValueError):
        popularity(n, -0.5)


def _numpy_all_to_allv(inputs, splits):
    """Rank r's output: from each source s in rank order, s's block towards r (numpy, no stepscope)."""
    n = len(inputs)
    starts = [np.concatenate([[0], np.cumsum(row)[:-1]]) for row in splits]
    return [np.concatenate([inputs[s][starts[s][r]:starts[s][r] + splits[s][r]] for s in range(n)])
            for r in range(n)]


@pytest.mark.parametrize("n, skew", [(2, 1.0), (3, 0.7), (4, 2.0), (5, 0.0)])
def test_check_pattern_matches_an_all_to_allv_and_catches_misplaced_data(n, skew):
    lay = layout("all_to_allv", 4 * 11 * n, "fp32", n, skew=skew, seed=1)  # 11 elements per peer on average
    assert lay.send_count == 11 * n and lay.count == 11
    inputs = [input_values("all_to_allv", np.arange(lay.send_count), r) for r in range(n)]
    outputs = _numpy_all_to_allv(inputs, lay.splits)
    transposed = tuple(zip(*lay.splits, strict=True))
    for rank, output in enumerate(outputs):
        assert len(output) == lay.recv_count_of(rank) <= lay.recv_count
        index = np.arange(len(output))
        expected = expected_values("all_to_allv", index, rank, n, lay.chunk, splits=lay.splits)
        assert np.array_equal(output, expected) and not np.any(expected == SENTINEL)
        tensor = expected_values("all_to_allv", torch.arange(len(output)), rank, n, lay.chunk, splits=lay.splits)
        assert np.array_equal(tensor.numpy(), expected)  # torch ranks compute the same values
        if len(output) > 1:  # a block shifted by one element is caught
            assert np.count_nonzero(np.roll(output, 1) != expected) > 0
    # a backend that swapped send and receive counts is caught on some rank whenever the split is uneven
    swapped = _numpy_all_to_allv(inputs, transposed)
    caught = [len(got) != lay.recv_count_of(r) or bool(np.any(
        got != expected_values("all_to_allv", np.arange(len(got)), r, n, lay.chunk, splits=lay.splits)))
        for r, got in enumerate(swapped)]
    assert any(caught) == (skew > 0)

def test_S_and_busbw_are_all_to_alls_and_the_hot_receiver_is_reported():
    n, requested = 4, 1 << 20
    even, uneven = layout("all_to_all", requested, "bf16", n), layout("all_to_allv", requested, "bf16", n, skew=1.0)
    assert uneven.size_bytes == even.size_bytes == requested  # S = bytes each rank sends
    assert (uneven.count, uneven.send_count) == (even.count, even.send_count)
    assert bandwidths_GBps("all_to_allv", requested, 1e-3, n) == bandwidths_GBps("all_to_all", requested, 1e-3, n)
    assert layout("all_to_allv", requested, "bf16", n, skew=0.0).splits == ((even.count,) * n,) * n
    point = CommPoint("gloo", "all_to_allv", n, requested, "bf16", "per-op", False, 1, 0, skew=1.0)
    metrics = timing_metrics(point, [1e-3, 2e-3], wrong=0)
    algbw = requested / 1e9 / 2e-3
    assert metrics["algbw_GBps"] == pytest.approx(algbw) and metrics["busbw_GBps"] == pytest.approx(algbw * 3 / 4)
    received = [sum(row[r] for row in uneven.splits) for r in range(n)]
    hot = int(np.argmax(received))
    assert metrics["imbalance"] == pytest.approx(max(received) / np.mean(received))
    assert metrics["recv_bytes_max"] == max(received) * 2
    assert metrics["recv_max_GBps"] == pytest.approx((max(received) - uneven.splits[hot][hot]) * 2 / 1e9 / 2e-3)
    assert point.config()["skew"] == 1.0 and "skew" not in CommPoint("gloo", "all_to_all", n, requested, "bf16",
                                                                       "per-op", False, 1, 0).config()


def _check_records(points, worlds, place_unsupported):
    for record in points:
        config, metrics = record["config"], record["metrics"]
        if config["in_place"] and config["op"] in place_unsupported:
            assert record["status"] == "unsupported", config
            continue
        assert record["status"] == "ok" and metrics["wrong"] == 0, (config, record.get("note"))
        n = config["world_size"]
        lay = layout(config["op"], config["requested_bytes"], config["dtype"], n, skew=config.get("skew", 0.0),
                     seed=config.get("seed", 0))
        assert config["size_bytes"] == lay.size_bytes == n * config["count"] * 4  # S = what each rank sends
        algbw = config["size_bytes"] / 1e9 / (metrics["time_us_max"] * 1e-6)
        assert metrics["algbw_GBps"] == pytest.approx(algbw)
        assert metrics["busbw_GBps"] == pytest.approx(algbw * (n - 1) / n)  # the nccl-tests factor
        if config["op"] == "all_to_allv":
            assert metrics["imbalance"] == pytest.approx(imbalance(lay.splits))
            assert (metrics["imbalance"] == 1.0) == (config["skew"] == 0)
    assert {r["config"]["world_size"] for r in points} == set(worlds)


def test_all_to_all_and_all_to_allv_are_correct_on_2_and_4_gloo_ranks(cli, tmp_path):
    out = tmp_path / "r"
    code, stdout, stderr = cli("comm", "--backend", "gloo", "--world", "2,4", "--op", "all_to_all,all_to_allv",
                               "--skew", "0,1.5", "--seed", "2", "--sizes", "1000,64K", "--iters", "2", "--warmup",
                               "1", "--format", "nccl-tests", "--no-plot", "--out", out, "--timeout", "60")
    assert code == 0, stderr
    points = read_records(out / "comm.jsonl")
    # per world: (all_to_all + all_to_allv at 2 skews) x 2 sizes x 2 placements
    assert len(points) == 2 * 3 * 2 * 2
    _check_records(points, (2, 4), place_unsupported=("all_to_all", "all_to_allv"))
    blocks = parse_nccl_tests(stdout)
    assert [(b.op, b.world_size, b.split) for b in blocks] == [
        (op, n, split) for n in (2, 4) for op, split in (("all_to_all", None), ("all_to_allv", (0.0, 2)),
                                                         ("all_to_allv", (1.5, 2)))]
    assert stdout.count("# Out of bounds values : 0 OK") == 6 and "FAILED" not in stdout
    assert "all_to_allv on 4 ranks: 1000 B rounded down to 992 B (a multiple of 4 whole fp32 elements" in stderr
    log = tmp_path / "alltoallv.log"
    log.write_text(stdout)
    imported = [r for r in import_records(log) if r["config"]["op"] == "all_to_allv"]
    measured = {(p["config"]["world_size"], p["config"]["skew"], p["config"]["size_bytes"]): p for p in points
                if p["config"]["op"] == "all_to_allv" and p["status"] == "ok"}
    assert {(r["config"]["world_size"], r["config"]["skew"], r["config"]["size_bytes"]) for r in imported} == \
        set(measured) and all(r["config"]["seed"] == 2 and r["metrics"]["wrong"] == 0 for r in imported)


def test_all_to_allv_is_correct_on_4_mpi_ranks(cli, tmp_path):
    pytest.importorskip("mpi4py")
    from stepscope.distributed.launch.mpi import find_mpiexec

    if find_mpiexec() is None:
        pytest.skip("no mpiexec")
    out = tmp_path / "m"
    code, stdout, stderr = cli("comm", "--backend", "mpi", "--world", "4", "--op", "all_to_all,all_to_allv",
                               "--skew", "0,2", "--sizes", "1000,64K", "--iters", "2", "--warmup", "1", "--tally",
                               "--no-plot", "--out", out, "--timeout", "60")
    assert code == 0, stderr
    points = read_records(out / "comm.jsonl")
    assert len(points) == 3 * 2 * 2
    _check_records(points, (4,), place_unsupported=("all_to_allv",))  # MPI_IN_PLACE all_to_all works
    assert "mpi all_to_allv | 4 ranks | fp32 | per-op | skew 2" in stdout and "MPI_Alltoallv" in stdout
    assert "unsupported: mpi all_to_allv in-place fp32: MPI_Alltoallv in place sends what it receives" in stdout
