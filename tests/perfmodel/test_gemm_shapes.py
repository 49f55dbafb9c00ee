"""GEMM efficiency by shape (model/rates.py): tile and wave quantization, the K law, chunked GEMMs, the power
limit, by hand."""

import dataclasses
import math

import pytest

from stepscope.perfmodel.model.op_types import Cost
from stepscope.perfmodel.model.ops import gemm_passes
from stepscope.perfmodel.model.rates import (
    efficiency,
    gemm_efficiency,
    matrix_compute,
    op_time,
    power_scale,
    tiling,
)
from stepscope.spec.system import load_system

H100 = load_system("H100-SXM").accelerator


def test_tiling_by_hand():
    # 8192 x 6144 outputs: 128x256 tiles give 64 x 24 = 1,536 tiles, 12 waves of 132 SMs (1,584 slots): 0.970
    assert tiling(H100, 8192, 6144) == pytest.approx(1536 / 1584)
    # 512 x 2688 (a tensor-parallel chunk): 128x128 tiles give 4 x 21 = 84 tiles in one wave of 132: 84/132; the
    # partial 2688/128 = 21 columns fit exactly, and 128x256 would leave half a tile column empty
    assert tiling(H100, 512, 2688) == pytest.approx(84 / 132)
    # grouped: 8 groups of 256 x 1536 rows: 8 x 2 x 6 = 96 tiles of 128x256, one wave of 132
    assert tiling(H100, 256, 1536, 8) == pytest.approx(96 / 132)
    # an unaligned edge wastes part of a tile: 100 x 100 in one 128x128 tile
    assert tiling(H100, 100, 100) == pytest.approx(100 * 100 / (132 * 128 * 128))
    # no SM count: no quantization
    assert tiling(dataclasses.replace(H100, sm_count=0), 100, 100) == 1.0


def test_the_k_law_by_hand():
    k0 = H100.gemm_k0["bf16"]
    eta = gemm_efficiency(H100, "bf16", 8192, 6144, 1024)
    flops = 2.0 * 8192 * 6144 * 1024
    assert eta == pytest.approx(efficiency(H100, flops) * 1024 / (1024 + k0) * 1536 / 1584)
    # fp8 has its own, larger K0; fp16 shares bf16's
    assert H100.gemm_k0["fp8"] > k0
    assert gemm_efficiency(H100, "fp16", 4096, 4096, 512) == gemm_efficiency(H100, "bf16", 4096, 4096, 512)


def test_a_linear_layer_runs_three_gemms_whose_flops_add_up():
    forward, backward = gemm_passes(4096, 8192, 1024)
    assert forward == ((4096, 1024, 8192, 1),)  # y[m, n] = x[m, k] w[k, n]: outputs m x n, inner k
    assert backward == ((4096, 8192, 1024, 1), (8192, 1024, 4096, 1))  # dx (inner n), dw (inner m: the tokens)
    assert sum(2 * m * n * k * g for m, n, k, g in backward) == 2 * sum(2 * m * n * k * g for m, n, k, g in forward)


def test_compute_time_is_the_sum_over_the_gemms_at_their_own_efficiency():
    gemms = ((4096, 1024, 8192, 1), (8192, 1024, 4096, 1))
    flops = sum(2.0 * m * n * k * g for m, n, k, g in gemms)
    cost = Cost(flops=flops, bytes=0.0, kernels=2, gemms=gemms)
    expected = sum(2.0 * m * n * k * g / (989e12 * gemm_efficiency(H100, "bf16", m, n, k, g)) for m, n, k, g in gemms)
    assert op_time(cost, "matrix", H100, "bf16").compute_s == pytest.approx(expected)
    # split into 8 chunks of 512 rows, run one at a time: each chunk pays its own waves
    chunked = sum(2.0 * m * n * k * g / (989e12 * gemm_efficiency(H100, "bf16", m / 8, n, k, g))
                  for m, n, k, g in gemms)
    assert matrix_compute(cost, "matrix", H100, "bf16", chunks=8) == pytest.approx(chunked)
    assert chunked > expected


def test_a_power_limit_below_the_measured_one_slows_matrix_work_only():
    capped = load_system("H100-SXM-500W").accelerator
    # ((500 - 100) / (700 - 100)) ** 0.5: the clock the lower limit allows
    assert power_scale(capped) == pytest.approx(math.sqrt(400 / 600)) and power_scale(H100) == 1.0
    gemm = Cost(flops=1e12, bytes=1e6, kernels=1, gemms=((8192, 8192, 7450.58, 1),))
    assert op_time(gemm, "matrix", capped, "bf16").compute_s == pytest.approx(
        op_time(gemm, "matrix", H100, "bf16").compute_s / math.sqrt(400 / 600))
    stream = Cost(flops=1e9, bytes=1e9, kernels=1)
    assert op_time(stream, "vector", capped, "bf16").total_s == op_time(stream, "vector", H100, "bf16").total_s
