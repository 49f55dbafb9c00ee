"""`FlashAttentionTriton`: FlashAttention-2 with Triton kernels, autotuned on GPUs.

Launches the kernels of `flash_triton_kernels`: a forward (grid: query tiles × batch·heads), a small
D = rowsum(dO ∘ O) pass, a dK/dV pass over query tiles (grid: key tiles × batch·heads) and a dQ pass
over key tiles (grid: query tiles × batch·heads), so no two programs write the same rows: no atomics.

- On a CUDA GPU, tile sizes, warps and pipeline stages are autotuned per shape (configurations aimed at
  H100/A100: 64–128 rows, 32–128 keys); `FlashAttentionTriton.tiles = TritonTiles(...)` fixes one.
- Without a GPU, Triton's interpreter runs the same kernels when TRITON_INTERPRET=1 is set before the
  kernels are imported (one fixed small configuration, since autotuning would run every candidate);
  the interpreter is ~100x slower than PyTorch, for tiny correctness checks only, and its bf16 `tl.dot`
  is wrong, so bf16 is refused there. Otherwise a clear error says what is missing.
- Triton itself is an optional dependency (`pip install 'stepscope[triton]'`): this module imports
  without it, and using the backend then says how to install it.
fp32 inputs use IEEE fp32 dots (not TF32) so the results match the fp32 reference tolerance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stepscope.errors import UsageError
from stepscope.kernels.flash_torch import check_inputs
from stepscope.nn.attention import register_attention

try:  # optional dependency
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    from stepscope.kernels import flash_triton_kernels as kernels

    INTERPRETED: bool = isinstance(kernels.flash_fwd_kernel, InterpretedFunction)
    """True when the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    _IMPORT_ERROR: str | None = None
except ImportError as error:
    triton = kernels = None
    INTERPRETED = False
    _IMPORT_ERROR = str(error)

LOG2E = math.log2(math.e)
HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head dimensions the kernels support (tl.arange needs a power of two)."""
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TritonUnavailable(UsageError):
    """flash-triton cannot run here (no triton, no GPU and no interpreter, or an unsupported input)."""


@dataclass(frozen=True)
class TritonTiles:
    """One fixed launch configuration for every kernel (instead of autotuning)."""

    block_q: int = 64
    """Query rows per program (forward, D and dQ) and per inner tile of the dK/dV pass."""
    block_k: int = 64
    """Keys per program of the dK/dV pass and per inner tile of the forward and dQ pass."""
    num_warps: int = 4
    """Warps per program (GPU only)."""
    num_stages: int = 2
    """Software-pipelining depth of the inner loops (GPU only)."""


INTERPRETER_TILES = TritonTiles(block_q=16, block_k=16, num_warps=1, num_stages=1)
"""Used under the interpreter when no tiles are fixed: small tiles keep the numpy work per program low."""


def unavailable_reason(device: torch.device | str, dtype: torch.dtype | None = None) -> str | None:
    """Why flash-triton cannot run on `device` in `dtype` here, or None when it can."""
    device = torch.device(device)
    if _IMPORT_ERROR is not None:
        return f"flash-triton needs the optional dependency triton (pip install 'stepscope[triton]'): {_IMPORT_ERROR}"
    if device.type == "cpu" and not INTERPRETED:
        return ("flash-triton needs a CUDA GPU; on a CPU-only machine set TRITON_INTERPRET=1 before starting "
                "(Triton's interpreter: slow, for tiny shapes only)")
    if device.type not in ("cpu", "cuda"):
        return f"flash-triton does not run on {device.type}"
    if dtype is not None and dtype not in DTYPES:
        return f"flash-triton supports fp32, fp16 and bf16, not {dtype}"
    if dtype == torch.bfloat16 and INTERPRETED:
        return "bf16 is not supported under TRITON_INTERPRET=1 (the interpreter's bf16 tl.dot is wrong); use fp32/fp16"
    return None


def _precision(dtype: torch.dtype) -> str:
    """IEEE fp32 dots for fp32 inputs (accuracy); 16-bit inputs use the tensor cores either way."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _configs(block_qs: tuple[int, ...], block_ks: tuple[int, ...], stages: tuple[int, ...]) -> list:
    return [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=warps, num_stages=stage)
            for bq in block_qs for bk in block_ks for warps in (4, 8) for stage in stages]


def _prune(configs: list, named_args: dict[str, Any], **_: Any) -> list:
    """Drop tiles much longer than the sequence (short sequences would waste most of each tile)."""
    limit_q = max(16, triton.next_power_of_2(named_args["n_queries"]))
    limit_k = max(16, triton.next_power_of_2(named_args["n_keys"]))
    kept = [c for c in configs if c.kwargs["BLOCK_Q"] <= limit_q and c.kwargs["BLOCK_K"] <= limit_k]
    return kept or configs[:1]


@functools.cache
def autotuned_kernels(do_bench: Callable | None = None) -> dict[str, Any]:
    """Autotuned launchers, built on first use; `do_bench(fn, quantiles)` replaces Triton's GPU timer
    (tests use a CPU clock to run the autotuning path under the interpreter)."""
    key = ["n_queries", "n_keys", "HEAD_DIM", "IS_CAUSAL", "PRECISION"]
    tune: dict[str, Any] = dict(key=key, prune_configs_by={"early_config_prune": _prune})
    if do_bench is not None:  # autotune(do_bench=) exists from Triton 3.3 on; without it Triton times on the GPU
        tune["do_bench"] = do_bench
    even_k = triton.heuristics({"EVEN_K": lambda args: args["n_keys"] % args["BLOCK_K"] == 0})
    return {
        "fwd": triton.autotune(_configs((64, 128), (32, 64, 128), (2, 3, 4)), **tune)(even_k(kernels.flash_fwd_kernel)),
        "dkdv": triton.autotune(_configs((32, 64), (64, 128), (2, 3)), **tune)(kernels.flash_bwd_dkdv_kernel),
        "dq": triton.autotune(_configs((64, 128), (32, 64), (2, 3)), **tune)(even_k(kernels.flash_bwd_dq_kernel)),
    }


def _launch(name: str, raw_kernel: Any, tiles: TritonTiles | None, rows_of_grid: int, batch_heads: int,
            grid_block: str, args: tuple, meta: dict[str, Any], n_keys: int, do_bench: Callable | None) -> None:
    """Launch `raw_kernel` with fixed `tiles`, or its autotuned wrapper `name` when tiles is None."""
    if tiles is None:
        kernel = autotuned_kernels(do_bench)[name]
        kernel[lambda m: (triton.cdiv(rows_of_grid, m[grid_block]), batch_heads)](*args, **meta)
        return
    block = tiles.block_q if grid_block == "BLOCK_Q" else tiles.block_k
    fixed = dict(BLOCK_Q=tiles.block_q, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
                 num_stages=tiles.num_stages)
    if name in ("fwd", "dq"):
        fixed["EVEN_K"] = n_keys % tiles.block_k == 0
    raw_kernel[(triton.cdiv(rows_of_grid, block), batch_heads)](*args, **meta, **fixed)


def triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   tiles: TritonTiles | None = None, do_bench: Callable | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) for contiguous q (BH, Nq, d), k and v (BH, Nk, d); L fp32 (BH, Nq), natural log.

    `tiles` None autotunes (timing candidates with `do_bench`, default Triton's GPU timer)."""
    batch_heads, n_queries, head_dim = q.shape
    n_keys = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(batch_heads, n_queries, dtype=torch.float32, device=q.device)
    args = (q, k, v, out, lse, q.stride(0), q.stride(1), k.stride(0), k.stride(1), n_queries, n_keys,
            LOG2E / math.sqrt(head_dim))
    meta = dict(IS_CAUSAL=causal, HEAD_DIM=head_dim, PRECISION=_precision(q.dtype))
    _launch("fwd", kernels.flash_fwd_kernel, tiles, n_queries, batch_heads, "BLOCK_Q", args, meta, n_keys, do_bench)
    return out, lse


def triton_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    grad_out: torch.Tensor, causal: bool, tiles: TritonTiles | None = None,
                    do_bench: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) for contiguous (BH, N, d) inputs, with P recomputed from L."""
    batch_heads, n_queries, head_dim = q.shape
    n_keys = k.shape[1]
    delta = torch.empty(batch_heads, n_queries, dtype=torch.float32, device=q.device)
    delta_block = tiles.block_q if tiles is not None else 64
    kernels.flash_bwd_delta_kernel[(triton.cdiv(n_queries, delta_block), batch_heads)](
        out, grad_out, delta, q.stride(0), q.stride(1), n_queries, HEAD_DIM=head_dim, BLOCK_Q=delta_block)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(head_dim)
    common = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), n_queries, n_keys, sm_scale * LOG2E, sm_scale)
    meta = dict(IS_CAUSAL=causal, HEAD_DIM=head_dim, PRECISION=_precision(q.dtype))
    _launch("dkdv", kernels.flash_bwd_dkdv_kernel, tiles, n_keys, batch_heads, "BLOCK_K",
            (q, k, v, grad_out, lse, delta, dk, dv, *common), meta, n_keys, do_bench)
    _launch("dq", kernels.flash_bwd_dq_kernel, tiles, n_queries, batch_heads, "BLOCK_Q",
            (q, k, v, grad_out, lse, delta, dq, *common), meta, n_keys, do_bench)
    return dq, dk, dv


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(..., N, d) -> contiguous (BH, N, d)."""
    return x.reshape(-1, *x.shape[-2:]).contiguous()


def _tiles_for(device: torch.device) -> TritonTiles | None:
    fixed = FlashAttentionTriton.tiles
    if fixed is None and device.type == "cpu":
        return INTERPRETER_TILES
    return fixed


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton: `FlashAttentionTriton.apply(q, k, v, is_causal)`.

    q (..., Nq, d), k and v (..., Nk, d), d in HEAD_DIMS; saves Q, K, V, O and the fp32 logsumexp only.
    """

    tiles: TritonTiles | None = None
    """A fixed configuration for every launch; None autotunes on GPUs (INTERPRETER_TILES on CPUs)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        check_inputs(q, k, v)
        reason = unavailable_reason(q.device, q.dtype)
        if reason:
            raise TritonUnavailable(reason)
        if q.shape[-1] not in HEAD_DIMS:
            raise TritonUnavailable(f"flash-triton supports head_dim {HEAD_DIMS}, got {q.shape[-1]}")
        out, lse = triton_forward(_flat(q), _flat(k), _flat(v), bool(is_causal), _tiles_for(q.device))
        out = out.view(q.shape)
        lse = lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = triton_backward(_flat(q), _flat(k), _flat(v), _flat(out), lse.reshape(-1, lse.shape[-1]),
                                     _flat(grad_out), ctx.is_causal, _tiles_for(q.device))
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None


def unsupported(device: torch.device, dtype: torch.dtype | None = None, head_dim: int | None = None) -> str | None:
    """`unavailable_reason`, and the head dimensions the kernels support (the attention registry asks this)."""
    reason = unavailable_reason(device, dtype)
    if reason is None and head_dim is not None and head_dim not in HEAD_DIMS:
        reason = f"flash-triton supports head_dim {HEAD_DIMS}, got {head_dim}"
    return reason


@register_attention("flash-triton", unsupported=unsupported)
def flash_triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """Attention backend `flash-triton` for TransformerLM and `stepscope step --attention flash-triton`."""
    return FlashAttentionTriton.apply(q, k, v, is_causal)
