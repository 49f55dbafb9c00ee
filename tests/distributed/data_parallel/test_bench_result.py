"""The figures `stepscope ddp` derives from its measured rounds, on rounds chosen by hand (no ranks spawned): the
ratio against PyTorch DDP agrees with the medians printed beside it, overlap stays within [0, 100] %, exposed
communication is the median of per-round differences, and the best variant is the least exposed one."""

from __future__ import annotations

import re

import pytest

from stepscope.distributed.data_parallel.bench_config import DDPBenchConfig
from stepscope.distributed.data_parallel.bench_result import DDPBenchResult, VariantResult
from stepscope.measure.stats import Stats
from stepscope.spec import get_preset

MS = 1e-3


def variant(label: str, rounds_ms: list[float], alone_ms: float | None) -> VariantResult:
    name = label.split()[0]
    cap = float(label.split()[1]) if name in ("bucketed", "torch") else None
    rounds = [r * MS for r in rounds_ms]
    return VariantResult(label=label, variant=name, bucket_MiB=cap, step=Stats.of(rounds), rounds=rounds,
                         comm_alone=None if alone_ms is None else Stats.of([alone_ms * MS] * 3), n_buckets=2,
                         max_rel_error=0.0, ok=True, comm_buffers_MiB=0.0, synced_grads_MiB=0.0, step_cores=1.0,
                         comm_cores=1.0)


def result() -> DDPBenchResult:
    """Five rounds; the compute-only step is 3 ms in each.

    bucketed 1 MiB: 5 6 7 20 21 (median 7); torch 1 MiB: 4 5 9.3 19 18 (median 9.3). Per-round ratios 1.25 1.2
    0.753 1.053 1.167 have the median 1.167, while the medians say 7 / 9.3 = 0.753: the ratio must be 0.753.
    Exposed: bucketed median(2 3 4 17 18) = 4 ms against 0.5 ms of communication alone (it hid none: overlap 0,
    where 1 - exposed / alone said -700 %); torch median(1 2 6.3 16 15) = 6.3 against 10 (overlap 37 %);
    naive: 2.9 in every round, exposed -0.1 against 1 ms alone (the step did not grow: overlap 100 %, not 110 %).
    """
    config = DDPBenchConfig(model=get_preset("tiny"), variants=("naive", "bucketed", "torch"), bucket_MiB=(1.0,),
                            iters=5)
    compute = variant("compute", [3, 3, 3, 3, 3], None)
    variants = [variant("naive", [2.9] * 5, 1.0), variant("bucketed 1", [5, 6, 7, 20, 21], 0.5),
                variant("torch 1", [4, 5, 9.3, 19, 18], 10.0)]
    return DDPBenchResult(config=config, compute=compute, variants=variants, memory={}, grad_bytes=1 << 20,
                          alpha_s=1e-4, bandwidth_Bps=1e9, allreduce_points=[(1 << 20, 1e-3)], world_size=2, threads=1,
                          backend="gloo", device="cpu")


def test_vs_torch_is_the_ratio_of_the_printed_medians():
    rows = {row["variant"]: row for row in result().rows()}
    bucketed = rows["bucketed 1"]
    assert bucketed["step_ms_median"] == pytest.approx(7.0) and rows["torch 1"]["step_ms_median"] == pytest.approx(9.3)
    assert bucketed["vs_torch"] == pytest.approx(7.0 / 9.3, rel=1e-12)
    assert bucketed["vs_torch"] == pytest.approx(bucketed["step_ms_median"] / rows["torch 1"]["step_ms_median"])


def test_the_summary_line_states_the_same_ratio():
    line = result().summary_lines()[0]
    torch_ratio = float(re.search(r"([\d.]+)x torch 1", line).group(1))
    assert torch_ratio == pytest.approx(7.0 / 9.3, abs=5e-4)
    naive_ratio = float(re.search(r"([\d.]+)x naive", line).group(1))
    assert naive_ratio == pytest.approx(7.0 / 2.9, abs=5e-4)
    assert "ratios of the median step times" in line


def test_overlap_is_a_share_of_the_communication_within_0_and_100():
    rows = {row["variant"]: row for row in result().rows()}
    assert rows["bucketed 1"]["exposed_comm_ms"] == pytest.approx(4.0)
    assert rows["bucketed 1"]["overlap_pct"] == 0.0
    assert rows["torch 1"]["exposed_comm_ms"] == pytest.approx(6.3)
    assert rows["torch 1"]["overlap_pct"] == pytest.approx(100 * (10 - 6.3) / 10, rel=1e-12)
    assert rows["naive"]["exposed_comm_ms"] == pytest.approx(-0.1)
    assert rows["naive"]["overlap_pct"] == 100.0
    assert rows["compute"]["overlap_pct"] is None
    records = result().records({})
    fractions = [r["metrics"].get("overlap_fraction") for r in records]
    assert fractions == [None, 1.0, 0.0, pytest.approx(0.37)]


def test_best_is_the_least_exposed_variant():
    r = result()
    assert r.best(["bucketed", "torch"]).label == "bucketed 1"  # 4 ms exposed against 6.3
    assert r.best(["naive", "torch"]).label == "naive"


def test_bstar_is_sqrt_of_gradient_bytes_bandwidth_and_latency_capped_at_one_bucket():
    r = result()  # s = 1 MiB of gradients, w = 1 GB/s, alpha = 0.1 ms
    assert r.bstar_bytes() == pytest.approx((2**20 * 1e9 * 1e-4) ** 0.5, rel=1e-12)  # 323,817.9 bytes
    line = next(line for line in r.summary_lines() if "b* = sqrt(s*w*alpha)" in line)
    assert "= 0.31 MiB (3.2 buckets)" in line
    slow_calls = DDPBenchResult(**{**vars(r), "alpha_s": 1.0})  # sqrt(s w alpha) = 32 MB > s: one bucket
    assert slow_calls.bstar_bytes() == 2**20
