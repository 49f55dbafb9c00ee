"""nccl-tests conventions without any rank: bus-bandwidth factors, S and rounding, sizes, the check's
data pattern against an independent numpy model of each collective, sweep planning, α–β fits."""

import numpy as np
import pytest

from stepscope.distributed.collectives.alpha_beta import fit_alpha_beta, fit_records
from stepscope.distributed.collectives.ops import (
    SENTINEL,
    bandwidths_GBps,
    busbw_factor,
    expected_values,
    input_values,
    layout,
)
from stepscope.distributed.collectives.points import plan_points
from stepscope.distributed.collectives.sizes import format_bytes, parse_sizes
from stepscope.errors import UsageError
from stepscope.results.store import make_record


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_bandwidth_factors(n):
    assert busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(op, n) == pytest.approx((n - 1) / n)
    assert busbw_factor("broadcast", n) == busbw_factor("reduce", n) == 1.0
    assert busbw_factor("barrier", n) is None


def test_bandwidths_follow_the_nccl_tests_formulas():
    algbw, busbw = bandwidths_GBps("all_reduce", 1_000_000_000, 0.5, 4)  # 1 GB in 0.5 s on 4 ranks
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(2.0 * 1.5)
    assert bandwidths_GBps("barrier", 0, 1e-5, 4) == (None, None)


def test_size_S_and_rounding_per_op():
    mib = 1 << 20
    assert layout("all_reduce", mib, "fp32", 3).size_bytes == mib  # per-rank buffer, no rounding
    gather = layout("all_gather", mib, "fp32", 3)  # 262144 elements do not split in 3
    assert (gather.count, gather.send_count, gather.recv_count) == (87381, 87381, 262143)
    assert gather.size_bytes == 262143 * 4 and gather.rounded  # S = total output
    scatter = layout("reduce_scatter", mib, "fp32", 4)
    assert (scatter.send_count, scatter.recv_count, scatter.size_bytes, scatter.rounded) == (262144, 65536, mib, False)
    a2a = layout("all_to_all", mib, "bf16", 4)
    assert (a2a.count, a2a.send_count, a2a.size_bytes) == (131072, 524288, mib)  # S = per-rank send bytes
    odd = layout("broadcast", 1001, "fp32", 2)
    assert odd.size_bytes == 1000 and odd.rounded  # whole elements


def test_size_lists_and_ranges():
    assert parse_sizes("1MB,10MB,100MB,1GB") == [1 << 20, 10 << 20, 100 << 20, 1 << 30]
    assert parse_sizes("1K:1G:x4")[:3] == [1024, 4096, 16384] and parse_sizes("1K:1G:x4")[-1] == 1 << 30
    assert parse_sizes("1K:4K:+1K") == [1024, 2048, 3072, 4096]
    assert parse_sizes("8:64") == [8, 16, 32, 64]  # nccl-tests' usual -f 2
    assert parse_sizes("1.5M,1536KiB") == [1572864]  # duplicates collapse
    assert format_bytes(1 << 20) == "1M" and format_bytes(1000) == "1000"
    for bad in ("", "1K,,2K", "12Q", "1K:1G:x1", "4K:1K", "1K:1G:+0", "1:1G:+1", "0"):
        with pytest.raises(UsageError):
            parse_sizes(bad)


def _reference_outputs(op, inputs, chunk, root=0):
    """What each rank's output holds after `op`, from numpy semantics independent of expected_values."""
    n = len(inputs)
    if op == "all_reduce":
        return [sum(inputs)] * n
    if op == "reduce":
        return [sum(inputs) if r == root else None for r in range(n)]
    if op == "broadcast":
        return [inputs[root]] * n
    if op == "all_gather":
        return [np.concatenate(inputs)] * n
    if op == "reduce_scatter":
        total = sum(inputs)
        return [total[r * chunk:(r + 1) * chunk] for r in range(n)]
    if op == "all_to_all":
        return [np.concatenate([inputs[src][r * chunk:(r + 1) * chunk] for src in range(n)]) for r in range(n)]
    raise KeyError(op)


@pytest.mark.parametrize("op", ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_check_pattern_matches_the_collective_and_catches_misplaced_data(op, n):
    lay = layout(op, 4 * 7 * n, "fp32", n)  # 7 elements per rank chunk
    inputs = [input_values(op, np.arange(lay.send_count), r) for r in range(n)]
    outputs = _reference_outputs(op, inputs, lay.chunk)
    for rank, output in enumerate(outputs):
        if output is None:
            continue
        expected = expected_values(op, np.arange(len(output)), rank, n, lay.chunk)
        assert np.array_equal(output, expected)
        assert not np.any(expected == SENTINEL)  # an unwritten output element always counts as wrong
        # the check must fail on a result from the wrong rank or the wrong place
        shifted = expected_values(op, np.arange(len(output)), (rank + 1) % n, n, lay.chunk)
        rolled = np.roll(output, lay.chunk if op in ("all_gather", "all_to_all") else 1)
        if op in ("reduce_scatter", "all_to_all"):  # outputs that differ per rank
            assert np.count_nonzero(shifted != output) > 0
        assert np.count_nonzero(rolled != expected) > 0


def test_reduction_values_stay_exact_in_low_precision():
    import torch

    n = 31
    total = sum(input_values("all_reduce", np.arange(1000), r) for r in range(n))
    assert total.max() <= 4 * n and np.array_equal(torch.tensor(total).to(torch.bfloat16).double().numpy(), total)
    moved = input_values("all_gather", np.arange(1000), 96)
    assert moved.max() < 97  # fits int8 and is exact in bf16


def test_plan_points_reports_rounding_and_skips():
    points, roundings, skipped = plan_points(backend="gloo", world_size=3, ops=["all_gather", "barrier"],
                                             sizes=[4, 1 << 20], dtypes=["fp32", "bf16"], modes=["per-op", "batch"],
                                             places=["out", "in"], iters=2, warmup=1)
    barriers = [p for p in points if p.op == "barrier"]
    assert [b.mode for b in barriers] == ["per-op", "batch"] and all(b.in_place is None for b in barriers)
    assert all(p.requested_bytes == 1 << 20 for p in points if p.op == "all_gather")  # 4 B < 1 elt per rank
    assert len(skipped) == 2 and "skipped" in skipped[0]
    assert {r.message() for r in roundings} == {
        "all_gather on 3 ranks: 1048576 B rounded down to 1048572 B (3 equal chunks of whole fp32 elements, "
        "like nccl-tests)",
        "all_gather on 3 ranks: 1048576 B rounded down to 1048572 B (3 equal chunks of whole bf16 elements, "
        "like nccl-tests)"}
    assert points[0].config()["size_bytes"] == 1048572 and points[0].config()["requested_bytes"] == 1 << 20


def test_alpha_beta_fit_recovers_a_known_model():
    sizes = np.geomspace(1e3, 1e9, 12)
    times = 30.0 + 1.5 * sizes / (20.0 * 1e3)  # alpha 30 us, busbw 20 GB/s, factor 1.5
    fit = fit_alpha_beta(sizes, times, bus_factor=1.5)
    assert fit.alpha_us == pytest.approx(30.0, rel=1e-9) and fit.beta_GBps == pytest.approx(20.0, rel=1e-9)
    assert fit.residual_rms_pct == pytest.approx(0, abs=1e-9) and fit.predict_us(1e6) == pytest.approx(105.0)
    noisy = times * (1 + 0.03 * np.random.default_rng(1).standard_normal(len(times)))
    rough = fit_alpha_beta(sizes, noisy, bus_factor=1.5)
    assert rough.alpha_us == pytest.approx(30.0, rel=0.1) and rough.beta_GBps == pytest.approx(20.0, rel=0.1)
    assert 0.5 < rough.residual_rms_pct < 10
    flat = fit_alpha_beta([1e3, 1e6], [50.0, 50.0])  # time does not grow: no bandwidth term
    assert flat.beta_GBps is None and flat.alpha_us == pytest.approx(50.0)
    negative = fit_alpha_beta([1e6, 2e6], [10.0, 30.0])  # intercept would be -10 us: clamped to 0
    assert negative.alpha_us == 0.0 and negative.beta_GBps > 0
    with pytest.raises(ValueError):
        fit_alpha_beta([1e3, 1e3], [1.0, 2.0])


def test_fit_records_group_points_and_name_their_metrics():
    def point(size, time_us, world=2):
        config = {"record": "point", "backend": "gloo", "op": "all_reduce", "world_size": world, "size_bytes": size,
                  "dtype": "fp32", "mode": "per-op", "in_place": True}
        return make_record("comm", config, {"time_us_max": time_us})

    records = [point(s, 10 + s / 1e3) for s in (1e3, 1e5, 1e7)] + [point(1e3, 5.0, world=4)]
    records += [point(1e3, 40.0, world=3), point(1e5, 20.0, world=3)]  # 2 noisy sizes: alpha would be ~40 us
    fits, notes = fit_records(records)
    assert len(fits) == 1 and fits[0]["config"]["record"] == "fit" and fits[0]["kind"] == "comm"
    assert fits[0]["metrics"]["alpha_us"] == pytest.approx(10.0)
    assert fits[0]["metrics"]["beta_GBps"] == pytest.approx(1.0)  # factor 1 on 2 ranks: 1e3 B/us
    why = "(two parameters through two points fit exactly: no residual to judge them)"
    prefix = "no α–β fit for gloo all_reduce fp32 per-op on"
    assert notes == [f"{prefix} 4 ranks in-place: needs at least 3 sizes, has 1 {why}",
                     f"{prefix} 3 ranks in-place: needs at least 3 sizes, has 2 {why}"]
