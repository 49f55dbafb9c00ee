"""When work runs and what hides behind what: overlap rules of tensor-, context- and expert-parallel exchanges, the
pipeline schedule (bubble, rounds), gradient buckets and the data-parallel collectives per step, ZeRO gathers, the
optimizer step. Over numpy arrays (one element per plan); ints work too.

The rules: docs/model.md, "The training stack" and "Mixture-of-Experts".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.spec import bytes_per_element
from stepscope.spec.system import Accelerator

DEFAULT_BUCKET_MIB = 25.0  # PyTorch DDP's default bucket_cap_mb

DISPATCHER_SMS = {"alltoall": 0, "deepep": 20, "deepep-fp8": 20}
"""SMs a MoE dispatcher's kernels hold while they run. DeepEP: 20, DeepSeek-V3's own figure (§3.2.2: "only 20
SMs are sufficient to fully utilize the bandwidths of IB and NVLink"; §3.5.1: "20 out of the 132 SMs available
in the H800 GPU") and the default of Megatron-Core (`moe_deepep_num_sms`) and NeMo AutoModel. HybridEP, which
`deepep` also stands for, runs on 32 in Megatron-Bridge's recipes; none of the validation runs overlaps it.
NCCL's all-to-all runs on SMs too, but on as many channels as NCCL's tuning picks: not modelled (0)."""

OPTIMIZER_FLOPS_PER_PARAM = 12.0  # Adam: moments, bias corrections, sqrt, division, weight decay, update
OPTIMIZER_KERNELS_PER_TENSOR = 1  # one fused (foreach / multi-tensor) pass per parameter tensor


def exposed(comm_s: Any, compute_s: Any, hides: Any) -> Any:
    """Communication left on the critical path after overlapping it (where `hides`) with `compute_s`."""
    return np.where(hides, np.maximum(0.0, comm_s - compute_s), comm_s)


def dispatcher_sm_share(dispatcher: str, accelerator: Accelerator) -> float:
    """Fraction of the GPU's SMs `dispatcher` holds while it runs (0 where either count is unknown)."""
    sms = DISPATCHER_SMS[dispatcher]
    return min(1.0, sms / accelerator.sm_count) if sms and accelerator.sm_count else 0.0


def overlapped_exchange(exchange_s: Any, gemm_s: Any, sm_share: float) -> Any:
    """What `exchange_s` of expert-parallel exchanges add to the `gemm_s` of GEMMs they overlap, holding
    `sm_share` of the SMs: while they run the GEMMs get 1 − share of the GPU, so the pair takes
    gemm + share·exchange, or the exchange itself once that is longer; max(share·exchange, exchange − gemm)."""
    return np.maximum(sm_share * exchange_s, exchange_s - gemm_s)


def bubble(pp: Any, interleave: Any, per_micro_batch_s: Any, rounds: Any = 1) -> Any:
    """Idle time of the 1F1B schedule: (p−1)/v micro-batch slots, once per pipeline round (a schedule run
    after another fills and drains the pipeline again)."""
    return rounds * (pp - 1) / interleave * per_micro_batch_s


def held_micro_batches(pp: Any, rank: Any, interleave: Any, micro_batches: Any) -> Any:
    """Micro-batches of a pipeline rank's layers whose activations it holds at its peak; ints or arrays.
    1F1B: its warm-up of p − rank − 1 forwards and the one in flight, min(p − rank, m). Interleaved 1F1B with v
    chunks (Megatron-Core's schedule, micro-batches grouped by p): a warm-up of 2(p − rank − 1) + (v − 1)·p chunk
    forwards and the one in flight, each chunk 1/v of its layers; at most all m micro-batches. On rank 0 this is
    Korthikanti et al.'s p·(1 + (p−1)/(p·v)); later ranks hold nearly as much (the last p − (p−1)/v), unlike
    plain 1F1B's p − rank."""
    plain = np.minimum(pp - rank, micro_batches)
    chunks = (2 * (pp - rank - 1) + (interleave - 1) * pp + 1) / interleave
    return np.where(interleave > 1, np.minimum(chunks, micro_batches), plain)


def zero3_gathers(pp: Any, rounds: Any, micro_batches: Any, backward: bool, reshard_after_forward: bool):
    """(forward, backward) ZeRO-3/FSDP weight gathers per step; ints or arrays. Without a backward pass the
    weights are gathered for every micro-batch's forward, or once when they are kept. With one, and without a
    pipeline, every forward gathers, and every backward too unless forward kept the weights. Under a pipeline
    schedule (`torch.distributed.pipelining`) a backward leaves the weights gathered until the round's end: with
    resharding after forward each backward gathers them again and so does each forward of a round's warm-up (at
    most p of its m/R micro-batches, the first stage's); without it one gather per round."""
    m, pipelined = micro_batches, pp > 1
    if not backward:
        return (m if reshard_after_forward else 1), 0
    if reshard_after_forward:
        warm_up = rounds * np.minimum(pp, m // rounds)
        return np.where(pipelined, warm_up, m), m
    return np.where(pipelined, rounds, m), 0


def gradient_reductions(pp: Any, rounds: Any, zero: Any, micro_batches: Any) -> Any:
    """Gradient reductions per step; ints or arrays. Under a pipeline schedule (torch.distributed.pipelining's
    `backward_maybe_with_nosync`; Megatron's 1F1B) gradients accumulate through a round's micro-batches and are
    reduced at its last backward, FSDP's sharded ones too: once per round. Without one, sharded gradients (ZeRO-2/3)
    have no full-size buffer to accumulate micro-batches into: they are reduced after every micro-batch."""
    return np.where(pp > 1, rounds, np.where(zero >= 2, micro_batches, 1))


def size_buckets(total_elements: Any, cap_elements: float) -> tuple[Any, Any]:
    """Size-based gradient buckets as (full buckets of `cap_elements`, the remainder launched last)."""
    full = np.maximum(0, np.ceil(total_elements / cap_elements) - 1)
    return full, total_elements - full * cap_elements


def dp_exposed(total_s: Any, last_s: Any, window_s: Any, overlap: bool) -> Any:
    """Exposed gradient-reduction time of buckets taking `total_s` in all: all of it, or what the backward window
    cannot hide (at least the last bucket's `last_s`, which is launched when backward ends)."""
    return np.maximum(total_s - window_s, last_s) if overlap else total_s


def optimizer_bytes_per_param(precision: str, grad_bytes: int) -> float:
    """Adam(W) streams: the gradient, m and v (read + write, fp32), the fp32 master weights (read +
    write) and, in mixed precision, the 16-bit working copy (write)."""
    working = bytes_per_element(precision) if precision != "fp32" else 0
    return grad_bytes + 2 * 8 + 2 * 4 + working


def optimizer_time(params: Any, tensors: Any, precision: str, grad_bytes: int, accelerator: Accelerator) -> Any:
    """Seconds of the Adam step over `params` local parameters held in `tensors` tensors: roofline of its FLOPs (in
    fp32 where the system lists an fp32 rate) and streamed bytes, plus one kernel per tensor."""
    rate = accelerator.vector_peak("fp32" if "fp32" in accelerator.vector_TFLOPps else precision)
    compute = OPTIMIZER_FLOPS_PER_PARAM * params / rate
    memory = params * optimizer_bytes_per_param(precision, grad_bytes) / accelerator.memory_bytes_per_s
    return np.maximum(compute, memory) + OPTIMIZER_KERNELS_PER_TENSOR * tensors * accelerator.kernel_overhead_us * 1e-6
