"""Time FlashAttentionTriton at the README's GPU goal shape, (16, 16384, 64) bf16 causal forward+backward,
for a few fixed tile configurations and then autotuned, each checked against PyTorch's SDPA.

    python3 scripts/flash_triton_tiles.py      (a CUDA GPU; prints one line per configuration)
"""

import time

import torch
import triton

from stepscope.kernels import flash_triton as ft

shape = (16, 16384, 64)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
grad = torch.randn_like(q)


def fwd_bwd(attention):
    return torch.autograd.grad(attention(q, k, v), (q, k, v), grad)


expected = fwd_bwd(lambda *x: torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True))
sdpa_ms = triton.testing.do_bench(lambda: fwd_bwd(
    lambda *x: torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True)))
print(f"sdpa: {sdpa_ms:.3f} ms", flush=True)
for tiles in (ft.TritonTiles(128, 64, 8, 3), ft.TritonTiles(128, 64, 4, 3), ft.TritonTiles(64, 64, 4, 3),
              ft.TritonTiles(128, 128, 8, 2), None):
    ft.FlashAttentionTriton.tiles = tiles
    start = time.perf_counter()
    got = fwd_bwd(lambda *x: ft.flash_triton_attention(*x, is_causal=True))
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    error = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, expected, strict=True))
    ms = triton.testing.do_bench(lambda: fwd_bwd(lambda *x: ft.flash_triton_attention(*x, is_causal=True)))
    print(f"{tiles or 'autotuned'}: {ms:.3f} ms (first call, compile or tune: {first_s:.1f} s), "
          f"max error vs sdpa relative to its largest value {error:.2e}", flush=True)
