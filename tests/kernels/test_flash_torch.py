"""FlashAttentionTorch against the fp64 reference: shapes, masks, dtypes, what it saves, its thread pool."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from stepscope.kernels.cpu_parallel import run_tasks, split_evenly
from stepscope.kernels.flash_torch import DEFAULT_TILES, FlashAttentionTorch, TileSizes
from stepscope.measure.device import cpu_threads
from stepscope.nn.attention_reference import reference_forward_backward, relative_error

SMALL_TILES = TileSizes(fwd_q=32, fwd_k=48, bwd_q=40, bwd_k=24)  # many ragged tiles at test sizes
FP32_TOLERANCE = 1e-5


@pytest.fixture
def tiles():
    """Set FlashAttentionTorch's tiles for one test, restore the default after it."""
    def use(value: TileSizes) -> None:
        FlashAttentionTorch.tiles = value

    yield use
    FlashAttentionTorch.tiles = DEFAULT_TILES


def run_flash(q, k, v, causal, grad_out):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = FlashAttentionTorch.apply(q, k, v, causal)
    out.backward(grad_out)
    return out, q.grad, k.grad, v.grad


def errors_against_reference(q, k, v, causal, grad_out, results):
    reference = reference_forward_backward(q, k, v, grad_out, causal)
    names = ("out", "dq", "dk", "dv")
    return {name: relative_error(value, reference[name]) for name, value in zip(names, results, strict=True)}


# (q shape, number of keys, causal, CPU threads): 2-D, 3-D and 4-D inputs, Nq > Nk and Nq < Nk, lengths
# that are not multiples of any tile, d in {16, 32, 64, 128}; 1 thread (inline), 2 threads with heads
# split between workers, and 2 threads with one head whose tiles are split (private dQ accumulators)
CASES = [
    ((2, 3, 100, 16), 100, True, 2),
    ((2, 3, 100, 16), 67, False, 1),
    ((2, 130, 64), 77, True, 2),
    ((1, 2, 45, 128), 97, True, 2),
    ((1, 1, 150, 64), 150, True, 2),
    ((1, 1, 150, 64), 101, False, 2),
    ((150, 32), 90, True, 1),
]


@pytest.mark.parametrize("q_shape, n_keys, causal, threads", CASES)
def test_forward_and_backward_match_fp64_reference(tiles, q_shape, n_keys, causal, threads):
    tiles(SMALL_TILES)
    torch.manual_seed(0)
    kv_shape = q_shape[:-2] + (n_keys, q_shape[-1])
    q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
    grad_out = torch.randn(q_shape)
    with cpu_threads(threads):
        results = run_flash(q, k, v, causal, grad_out)
    assert results[0].dtype == torch.float32 and results[0].shape == q_shape
    errors = errors_against_reference(q, k, v, causal, grad_out, results)
    assert max(errors.values()) < FP32_TOLERANCE, errors


def test_default_tiles_across_a_tile_boundary():
    torch.manual_seed(1)
    q, k, v, grad_out = (torch.randn(2, 1100, 16) for _ in range(4))
    errors = errors_against_reference(q, k, v, True, grad_out, run_flash(q, k, v, True, grad_out))
    assert max(errors.values()) < FP32_TOLERANCE, errors


def test_large_scores_stay_finite_and_as_exact_as_sdpa(tiles):
    """Scores of ~1e3: the online softmax neither overflows nor loses more digits than SDPA in fp32
    (the forward and the backward must round the scores the same way for exp(s - L) to stay exact)."""
    tiles(SMALL_TILES)
    torch.manual_seed(2)
    q, k, v, grad_out = (torch.randn(2, 90, 16) for _ in range(4))
    q = q * 300.0
    flash = run_flash(q, k, v, True, grad_out)
    assert all(torch.isfinite(r).all() for r in flash)
    qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], is_causal=True)[0]
    out.backward(grad_out)
    flash_errors = errors_against_reference(q, k, v, True, grad_out, flash)
    sdpa_errors = errors_against_reference(q, k, v, True, grad_out, (out, qs.grad, ks.grad, vs.grad))
    for name in flash_errors:
        assert flash_errors[name] <= 2 * sdpa_errors[name], (name, flash_errors, sdpa_errors)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_low_precision_error_at_most_twice_sdpa(tiles, dtype, causal):
    """Against fp64, each of out, dQ, dK, dV is at most 2x as wrong as PyTorch's SDPA in the same dtype."""
    tiles(SMALL_TILES)
    torch.manual_seed(3)
    q, k, v, grad_out = (torch.randn(2, 3, 100, 64).to(dtype) for _ in range(4))
    flash = run_flash(q, k, v, causal, grad_out)
    assert flash[0].dtype == dtype and all(g.dtype == dtype for g in flash[1:])
    qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    out.backward(grad_out)
    flash_errors = errors_against_reference(q, k, v, causal, grad_out, flash)
    sdpa_errors = errors_against_reference(q, k, v, causal, grad_out, (out, qs.grad, ks.grad, vs.grad))
    for name in flash_errors:
        assert flash_errors[name] <= 2 * sdpa_errors[name], (name, flash_errors, sdpa_errors)


@pytest.mark.parametrize("q_shape", [(2, 3, 70, 16), (2, 70, 16)])
def test_saves_q_k_v_o_and_exactly_one_fp32_logsumexp(q_shape):
    saved = []
    q, k, v = (torch.randn(q_shape, requires_grad=True) for _ in range(3))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = FlashAttentionTorch.apply(q, k, v, True)
    assert len(saved) == 5
    assert all(a is b for a, b in zip(saved[:3], (q, k, v), strict=True))
    assert saved[3] is out or saved[3].data_ptr() == out.data_ptr()
    row_shaped = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(row_shaped) == 1 and row_shaped[0].dtype == torch.float32
    assert not any(t.dim() >= 2 and t.shape[-2:] == (70, 70) for t in saved)  # no N x N tensor


def test_run_tasks_raises_the_first_failure_and_restores_the_thread_count():
    ran = []

    def fail():
        raise RuntimeError("task failed")

    with cpu_threads(2):
        with pytest.raises(RuntimeError, match="task failed"):
            run_tasks([lambda: ran.append(1), fail, lambda: ran.append(2)], workers=2)
        assert torch.get_num_threads() == 2
    assert split_evenly(10, 3) == [slice(0, 3), slice(3, 6), slice(6, 10)]
    assert split_evenly(2, 5) == [slice(0, 1), slice(1, 2)]


def test_importing_kernels_package_imports_neither_kernel_nor_triton():
    code = ("import sys, stepscope.kernels as k; "
            "assert 'triton' not in sys.modules and 'stepscope.kernels.flash_torch' not in sys.modules; "
            "assert k.FlashAttentionTorch.__name__ == 'FlashAttentionTorch'; "
            "from stepscope.nn import get_attention; get_attention('flash-torch')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_under_a_profiler_the_tiles_run_where_the_profiler_sees_them():
    """torch.profiler records only its own thread: flash-torch then runs inline, so `stepscope profile`
    and `stepscope memory` see its matmuls and allocations."""
    q, k, v = (torch.randn(2, 4, 256, 16, requires_grad=True) for _ in range(3))
    counts = []
    for threads in (1, 2):
        with cpu_threads(threads), torch.profiler.profile() as prof:
            FlashAttentionTorch.apply(q, k, v, True).sum().backward()
        counts.append(sum(1 for event in prof.events() if event.name == "aten::bmm"))
    assert counts[0] > 0 and counts[0] == counts[1]


def test_autocast_does_not_lower_the_internal_precision():
    """Under bf16 autocast (the model's mixed precision) the tiles still accumulate in fp32."""
    torch.manual_seed(4)
    q, k, v, grad_out = (torch.randn(2, 2, 100, 16).to(torch.bfloat16) for _ in range(4))
    plain = run_flash(q, k, v, True, grad_out)
    with cpu_threads(1), torch.autocast("cpu", dtype=torch.bfloat16):  # 1 thread: tiles on this thread
        autocast = run_flash(q, k, v, True, grad_out)
    for a, b in zip(plain, autocast, strict=True):
        assert torch.equal(a, b)
