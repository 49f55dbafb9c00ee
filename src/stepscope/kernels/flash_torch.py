"""`FlashAttentionTorch`: FlashAttention-2 as tiled PyTorch loops, tuned for CPUs; runs on any device.

Forward (per block of query rows, all batch·heads at once): an online softmax over key tiles with a
running row max m, row sum l and unnormalized fp32 output; only the logsumexp L = m + log l is kept.
Backward recomputes P = exp(s·QKᵀ − L) tile by tile from L, with D = rowsum(dO ∘ O): no N×N tensor
is ever stored, so memory grows linearly with the sequence length.

CPU tuning (measured with `stepscope attention`, see docs/attention.md):
- large tiles: every tile costs ~10 PyTorch calls of interpreter overhead, so a tile must hold enough
  work (a group of batch·heads per call, 128 rows x 1024 keys by default);
- worker threads instead of parallel ops (kernels/cpu_parallel.py): blocks of rows run as tasks on
  `torch.get_num_threads()` threads, each op single-threaded, so thousands of small ops do not each
  end in a thread-pool barrier (several-fold slower than PyTorch's fused kernel on a busy machine);
- causal tile skipping: keys after the query block are never touched; keys before it form unmasked
  tiles; only the diagonal square (at most one tile per block) is masked;
- in place: scores become probabilities, and dP becomes dS, in the same buffer; the softmax scale is
  folded into Q once instead of into every score tile;
- exp2: exp(s − m) is computed as exp2((s − m)·log2 e) because PyTorch's CPU `exp2` is about 4x
  faster than its `exp` (the one elementwise op that costs as much as a matmul). The conversion is
  applied to the small difference s − m, not folded into the scale: at large |s| the forward and the
  backward must round the scores identically, or exp(s − L) loses digits the reference keeps;
- one backward pass: on a CPU, dQ can accumulate across key tiles without atomics, so the dK/dV and
  dQ loops of the GPU kernel are one loop here.
Inputs in fp16/bf16 are computed in fp32 (fp32 accumulation, output cast back to the input dtype).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from stepscope.kernels.cpu_parallel import cpu_workers, run_tasks, split_evenly
from stepscope.nn.attention import register_attention
from stepscope.nn.attention_reference import MASKED_SCORE


@dataclass(frozen=True)
class TileSizes:
    """Rows of Q and of K/V per tile, forward and backward (the last tile of a sequence may be shorter)."""

    fwd_q: int = 128
    """Query rows per forward block (the online softmax runs across key tiles for these rows)."""
    fwd_k: int = 1024
    """Keys per forward tile."""
    bwd_q: int = 1024
    """Query rows per backward tile."""
    bwd_k: int = 128
    """Keys per backward block (dK and dV of these keys accumulate across query tiles)."""


# Tuned on a 2-core AVX-512 CPU (fp32, causal, batch·heads 8, N 4096, d 64, fwd+bwd, interleaved with
# SDPA): 128x1024 / 1024x128 measured 1.03x SDPA where 256x256 measured 1.23x and 512x512 1.73x in the
# same run; narrow blocks waste little on the causal diagonal, long tiles keep the number of calls low.
DEFAULT_TILES = TileSizes()
LOG2_E = math.log2(math.e)


class _Scratch:
    """Score-tile buffers reused across the tiles of one call, one set per worker thread.

    A fresh multi-megabyte tensor per tile is not free on a CPU: the allocator hands large blocks back
    to the OS, so every new tile is page-faulted (and zeroed by the kernel) again; that showed up as
    a third of the forward's time in system time.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.buffers: dict[tuple[int, str], torch.Tensor] = {}

    def tile(self, name: str, shape: tuple[int, int, int]) -> torch.Tensor:
        """A contiguous uninitialized tensor of `shape`, private to this thread and `name`."""
        key, numel = (threading.get_ident(), name), shape[0] * shape[1] * shape[2]
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffers[key] = torch.empty(numel, dtype=self.dtype, device=self.device)
        return buffer[:numel].view(shape)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64 (for tests); everything else is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _mask_diagonal(scores: torch.Tensor, query_start: int, key_start: int) -> None:
    """Set scores of keys after their query to MASKED_SCORE (top-left aligned causal mask), in place."""
    rows, cols = scores.shape[-2:]
    query = torch.arange(query_start, query_start + rows, device=scores.device).unsqueeze(-1)
    key = torch.arange(key_start, key_start + cols, device=scores.device)
    scores.masked_fill_(key > query, MASKED_SCORE)


def _key_tiles(q_start: int, q_end: int, n_keys: int, tile: int, causal: bool) -> list[tuple[int, int, bool]]:
    """(start, end, masked) key ranges a query block [q_start, q_end) must visit, in ascending order.

    Causal: keys before q_start are visible to every row of the block (unmasked tiles); keys in
    [q_start, q_end) form one diagonal tile that needs the mask; later keys are skipped entirely.
    """
    if not causal:
        return [(j, min(j + tile, n_keys), False) for j in range(0, n_keys, tile)]
    full_end = min(q_start, n_keys)
    tiles = [(j, min(j + tile, full_end), False) for j in range(0, full_end, tile)]
    if q_start < n_keys:
        tiles.append((q_start, min(q_end, n_keys), True))
    return tiles


def _query_tiles(k_start: int, k_end: int, n_queries: int, tile: int, causal: bool) -> list[tuple[int, int, bool]]:
    """(start, end, masked) query ranges that see some key of [k_start, k_end): the backward's mirror image.

    Causal: queries before k_start see none of these keys (skipped); queries in [k_start, k_end) form
    the diagonal tile (masked); queries from k_end on see every key of the block (unmasked tiles).
    """
    if not causal:
        return [(i, min(i + tile, n_queries), False) for i in range(0, n_queries, tile)]
    if k_start >= n_queries:
        return []
    tiles = [(k_start, min(k_end, n_queries), True)]
    tiles += [(i, min(i + tile, n_queries), False) for i in range(k_end, n_queries, tile)]
    return tiles


def _plan(batch_heads: int, n_blocks: int, workers: int) -> tuple[list[slice], bool]:
    """Head groups to run as separate tasks, and whether tasks split one head's blocks between them.

    With at least as many heads as workers, each worker gets whole heads (ops batched over a group
    of heads, no two tasks write the same rows); otherwise single heads are split by blocks.
    """
    if workers <= 1 or n_blocks * batch_heads <= 1:
        return [slice(0, batch_heads)], False
    if batch_heads >= workers:
        return split_evenly(batch_heads, workers), False
    return split_evenly(batch_heads, batch_heads), True


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  tiles: TileSizes = DEFAULT_TILES, workers: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) for q (BH, Nq, d), k and v (BH, Nk, d): O in q's dtype, L (BH, Nq) in the work dtype."""
    work = _work_dtype(q.dtype)
    batch_heads, n_queries, head_dim = q.shape
    n_keys = k.shape[1]
    q_scaled = q.to(work) * (1.0 / math.sqrt(head_dim))
    k_t = k.to(work).transpose(1, 2)
    v_work = v.to(work)
    out = torch.empty(batch_heads, n_queries, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch_heads, n_queries, dtype=work, device=q.device)
    scratch = _Scratch(work, q.device)

    def block(heads: slice, q_start: int, q_end: int) -> None:
        """Online softmax over the key tiles for query rows [q_start, q_end) of `heads`."""
        q_block = q_scaled[heads, q_start:q_end]
        row_max = row_sum = acc = None
        for k_start, k_end, masked in _key_tiles(q_start, q_end, n_keys, tiles.fwd_k, causal):
            shape = (q_block.shape[0], q_end - q_start, k_end - k_start)
            scores = torch.bmm(q_block, k_t[heads, :, k_start:k_end], out=scratch.tile("scores", shape))
            if masked:
                _mask_diagonal(scores, q_start, k_start)
            tile_max = scores.amax(dim=-1, keepdim=True)
            new_max = tile_max if row_max is None else torch.maximum(row_max, tile_max)
            probs = scores.sub_(new_max).mul_(LOG2_E).exp2_()  # in place: the scores buffer becomes P
            if acc is None:
                row_sum = probs.sum(dim=-1, keepdim=True)
                acc = torch.bmm(probs, v_work[heads, k_start:k_end])
            else:
                alpha = torch.exp2_((row_max - new_max).mul_(LOG2_E))
                row_sum.mul_(alpha).add_(probs.sum(dim=-1, keepdim=True))
                acc.mul_(alpha).baddbmm_(probs, v_work[heads, k_start:k_end])
            row_max = new_max
        out[heads, q_start:q_end] = acc.div_(row_sum)
        lse[heads, q_start:q_end] = (row_max + row_sum.log_()).squeeze(-1)

    blocks = [(i, min(i + tiles.fwd_q, n_queries)) for i in range(0, n_queries, tiles.fwd_q)]
    if causal:
        blocks.reverse()  # later query blocks see more keys: start the longest tasks first
    workers = cpu_workers(q.device) if workers is None else workers
    groups, _ = _plan(batch_heads, len(blocks), workers)
    run_tasks([partial(block, heads, start, end) for start, end in blocks for heads in groups], workers)
    return out, lse


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   grad_out: torch.Tensor, causal: bool, tiles: TileSizes = DEFAULT_TILES,
                   workers: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the inputs' dtypes, recomputing P tile by tile from L."""
    work = _work_dtype(q.dtype)
    n_queries, head_dim = q.shape[1:]
    n_keys = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim)
    q_scaled = q.to(work) * scale
    k_work, v_work = k.to(work), v.to(work)
    d_out = grad_out.to(work)
    # D = rowsum(dO ∘ O): the softmax-Jacobian term, once for all tiles
    delta = (d_out * out.to(work)).sum(dim=-1, keepdim=True)
    lse = lse.unsqueeze(-1)
    dq = torch.zeros_like(q_scaled)
    dk = torch.zeros_like(k_work)
    dv = torch.zeros_like(v_work)
    private_dq: dict[int, torch.Tensor] = {}  # per worker thread, when tasks share a head's dQ rows
    lock = threading.Lock()
    scratch = _Scratch(work, q.device)

    def key_block(heads: slice, k_start: int, k_end: int, shared: bool) -> None:
        """dK, dV of keys [k_start, k_end) of `heads`, and their contribution to dQ."""
        if shared:
            with lock:
                target = private_dq.setdefault(threading.get_ident(), torch.zeros_like(dq))
        else:
            target = dq
        k_block, v_block = k_work[heads, k_start:k_end], v_work[heads, k_start:k_end]
        k_block_t, v_block_t = k_block.transpose(1, 2), v_block.transpose(1, 2)
        dk_block, dv_block = dk[heads, k_start:k_end], dv[heads, k_start:k_end]
        for q_start, q_end, masked in _query_tiles(k_start, k_end, n_queries, tiles.bwd_q, causal):
            q_tile, d_out_tile = q_scaled[heads, q_start:q_end], d_out[heads, q_start:q_end]
            shape = (q_tile.shape[0], q_end - q_start, k_end - k_start)
            scores = torch.bmm(q_tile, k_block_t, out=scratch.tile("scores", shape))
            if masked:
                _mask_diagonal(scores, q_start, k_start)
            probs = scores.sub_(lse[heads, q_start:q_end]).mul_(LOG2_E).exp2_()
            dv_block.baddbmm_(probs.transpose(1, 2), d_out_tile)
            d_scores = torch.bmm(d_out_tile, v_block_t, out=scratch.tile("d_scores", shape))
            d_scores.sub_(delta[heads, q_start:q_end]).mul_(probs)
            dk_block.baddbmm_(d_scores.transpose(1, 2), q_tile)  # Q is pre-scaled: dK = s·dSᵀQ
            target[heads, q_start:q_end].baddbmm_(d_scores, k_block)

    blocks = [(j, min(j + tiles.bwd_k, n_keys)) for j in range(0, n_keys, tiles.bwd_k)]
    workers = cpu_workers(q.device) if workers is None else workers
    groups, shared = _plan(q.shape[0], len(blocks), workers)
    if shared:  # one task per (head, key block); with causal, early key blocks see more queries
        tasks = [partial(key_block, heads, start, end, True) for start, end in blocks for heads in groups]
    else:  # one task per head group, owning its dQ rows
        tasks = [partial(_each, [partial(key_block, heads, start, end, False) for start, end in blocks])
                 for heads in groups]
    run_tasks(tasks, workers)
    for partial_dq in private_dq.values():
        dq.add_(partial_dq)
    return dq.mul_(scale).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _each(calls: list) -> None:
    for call in calls:
        call()


def _flatten(x: torch.Tensor) -> torch.Tensor:
    """(..., N, d) -> (BH, N, d), a view when the layout allows."""
    return x.reshape(-1, *x.shape[-2:])


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes (..., N, d) with equal leading dims and head_dim, keys and values of one length, one dtype."""
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must be (..., N, d) with the same rank, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible q, k, v shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError("v must have the same head_dim as q and k")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


class FlashAttentionTorch(torch.autograd.Function):
    """FlashAttention-2 in tiled PyTorch: `FlashAttentionTorch.apply(q, k, v, is_causal)`.

    q (..., Nq, d), k and v (..., Nk, d); saves Q, K, V, O and the fp32 logsumexp (..., Nq) only.
    Autocast is switched off inside (the kernel chooses its own fp32 accumulation); `tiles` sets the
    tile sizes of every later call.
    """

    tiles: TileSizes = DEFAULT_TILES

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        check_inputs(q, k, v)
        with torch.autocast(q.device.type, enabled=False):
            out, lse = flash_forward(_flatten(q), _flatten(k), _flatten(v), bool(is_causal), FlashAttentionTorch.tiles)
        out = out.view(q.shape[:-1] + v.shape[-1:])
        lse = lse.view(q.shape[:-1])  # fp32 (fp64 for fp64 inputs): the work dtype
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            dq, dk, dv = flash_backward(_flatten(q), _flatten(k), _flatten(v), _flatten(out),
                                        lse.reshape(-1, lse.shape[-1]), _flatten(grad_out), ctx.is_causal,
                                        FlashAttentionTorch.tiles)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None


@register_attention("flash-torch")
def flash_torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """Attention backend `flash-torch` for TransformerLM and `stepscope step --attention flash-torch`."""
    return FlashAttentionTorch.apply(q, k, v, is_causal)
