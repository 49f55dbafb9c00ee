"""FlashAttentionTriton's kernels against the fp64 reference, under Triton's interpreter on a CPU (on a
GPU, the same tests run the compiled kernels). Tiny shapes: the interpreter runs programs one by one."""

import time

import pytest
import torch
import torch.nn.functional as F

from stepscope.errors import UsageError
from stepscope.nn.attention_reference import reference_forward_backward, relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOLERANCE = 1e-5


@pytest.fixture
def triton_module():
    """The module, with FlashAttentionTriton.tiles restored after the test."""
    from stepscope.kernels import flash_triton

    if flash_triton.unavailable_reason(DEVICE) is not None:
        pytest.fail(flash_triton.unavailable_reason(DEVICE))
    yield flash_triton
    flash_triton.FlashAttentionTriton.tiles = None


def run(fn, q, k, v, causal, grad_out):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, causal)
    out.backward(grad_out)
    return out, q.grad, k.grad, v.grad


def errors(q, k, v, causal, grad_out, results):
    reference = reference_forward_backward(q, k, v, grad_out, causal)
    names = ("out", "dq", "dk", "dv")
    return {name: relative_error(value, reference[name]) for name, value in zip(names, results, strict=True)}


def inputs(q_shape, n_keys, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    kv_shape = q_shape[:-2] + (n_keys, q_shape[-1])
    return tuple(torch.randn(shape, generator=generator).to(DEVICE, dtype) for shape in (q_shape, kv_shape, kv_shape,
                                                                                           q_shape))


# 3-D and 4-D, Nq = Nk, Nq < Nk and Nq > Nk, lengths off the 16-row tiles, d in {16, 32, 64, 128}
CASES = [
    ((2, 40, 16), 40, True),
    ((1, 2, 37, 32), 53, True),
    ((2, 53, 16), 37, True),
    ((2, 50, 16), 35, False),
    ((1, 1, 33, 64), 33, True),
    ((1, 20, 128), 20, True),
]


@pytest.mark.parametrize("q_shape, n_keys, causal", CASES)
def test_fp32_forward_and_backward_match_reference(triton_module, q_shape, n_keys, causal):
    q, k, v, grad_out = inputs(q_shape, n_keys)
    results = run(triton_module.FlashAttentionTriton.apply, q, k, v, causal, grad_out)
    assert results[0].dtype == torch.float32 and results[0].shape == q_shape
    found = errors(q, k, v, causal, grad_out, results)
    assert max(found.values()) < FP32_TOLERANCE, found


@pytest.mark.parametrize("block_q, block_k", [(32, 16), (16, 32)])
def test_other_fixed_tiles_including_several_diagonal_tiles(triton_module, block_q, block_k):
    triton_module.FlashAttentionTriton.tiles = triton_module.TritonTiles(block_q, block_k, num_warps=1, num_stages=1)
    for q_shape, n_keys in (((2, 70, 16), 70), ((2, 45, 32), 97), ((2, 97, 16), 45)):
        q, k, v, grad_out = inputs(q_shape, n_keys, seed=1)
        found = errors(q, k, v, True, grad_out, run(triton_module.FlashAttentionTriton.apply, q, k, v, True, grad_out))
        assert max(found.values()) < FP32_TOLERANCE, (q_shape, n_keys, found)


@pytest.mark.parametrize("causal", [True, False])
def test_fp16_error_at_most_twice_sdpa(triton_module, causal):
    q, k, v, grad_out = inputs((1, 2, 37, 64), 53 if not causal else 37, torch.float16, seed=2)
    flash = run(triton_module.FlashAttentionTriton.apply, q, k, v, causal, grad_out)
    assert flash[0].dtype == torch.float16
    sdpa = run(lambda *a: F.scaled_dot_product_attention(*a[:3], is_causal=a[3]), q, k, v, causal, grad_out)
    flash_errors, sdpa_errors = errors(q, k, v, causal, grad_out, flash), errors(q, k, v, causal, grad_out, sdpa)
    for name in flash_errors:
        assert flash_errors[name] <= 2 * sdpa_errors[name], (name, flash_errors, sdpa_errors)


def test_autotuned_launch_path(triton_module):
    """The GPU path (autotune + heuristics + grid from the chosen tiles), timed with a CPU clock here."""
    def cpu_bench(fn, quantiles):
        start = time.perf_counter()
        fn()
        return [(time.perf_counter() - start) * 1e3] * len(quantiles)

    q, k, v, grad_out = inputs((2, 48, 16), 40, seed=3)
    out, lse = triton_module.triton_forward(q, k, v, True, tiles=None, do_bench=cpu_bench)
    dq, dk, dv = triton_module.triton_backward(q, k, v, out, lse, grad_out, True, tiles=None, do_bench=cpu_bench)
    found = errors(q, k, v, True, grad_out, (out, dq, dk, dv))
    assert max(found.values()) < FP32_TOLERANCE, found
    tuned = triton_module.autotuned_kernels(cpu_bench)
    assert all(kernel.best_config is not None for kernel in tuned.values())


def test_saves_exactly_one_fp32_logsumexp(triton_module):
    saved = []
    q, k, v, _ = inputs((2, 3, 20, 16), 20)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = triton_module.FlashAttentionTriton.apply(q, k, v, True)
    assert len(saved) == 5 and saved[3].data_ptr() == out.data_ptr()
    row_shaped = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(row_shaped) == 1 and row_shaped[0].dtype == torch.float32


def test_clear_errors_where_it_cannot_run(triton_module, monkeypatch):
    if DEVICE == "cpu":
        with pytest.raises(UsageError, match="bf16 is not supported under TRITON_INTERPRET"):
            triton_module.FlashAttentionTriton.apply(*(torch.randn(1, 16, 16, dtype=torch.bfloat16),) * 3, True)
        monkeypatch.setattr(triton_module, "INTERPRETED", False)  # as if TRITON_INTERPRET had not been set
        with pytest.raises(UsageError, match="needs a CUDA GPU; on a CPU-only machine set TRITON_INTERPRET=1"):
            triton_module.FlashAttentionTriton.apply(*(torch.randn(1, 16, 16),) * 3, True)
        monkeypatch.undo()
    with pytest.raises(UsageError, match="head_dim"):
        triton_module.FlashAttentionTriton.apply(*(torch.randn(1, 16, 24, device=DEVICE),) * 3, True)
