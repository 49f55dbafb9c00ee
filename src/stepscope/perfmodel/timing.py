"""From op counts to seconds: roofline per op, exposed communication, pipeline bubble, data-parallel
overlap and the optimizer step (scalar reference; `vectorized.py` has the array form).

- An op takes max(compute, memory) + kernels x overhead, where compute = FLOPs / (peak·η(FLOPs per
  kernel)) for matrix ops (η from the system's efficiency curve, times `flash_efficiency` for fused
  attention and `fp8_efficiency` for fp8 GEMMs) and FLOPs / vector peak for elementwise ops;
  memory = bytes / (HBM bandwidth·efficiency).
- A tensor/context-parallel collective is exposed, unless the plan overlaps it with its op, in which case
  only what exceeds the op's compute time shows (TP collectives only when the TP group is inside one fast
  domain: `Collective.hides`).
- Expert-parallel exchanges overlapped with the MoE block's GEMMs (`ParallelPlan.ep_overlap`) hide behind
  them, but a dispatcher whose kernels hold SMs (DeepEP: 20) leaves the GEMMs the rest while it runs:
  what the pair adds to the GEMMs is max(share x exchange, exchange − GEMMs) (`overlapped_exchange`).
- Pipeline (1F1B, v virtual chunks): bubble = (p−1)/v x (forward + backward of one micro-batch on the
  slowest stage), i.e. a fraction (p−1)/(v·m) of the m micro-batches' time.
- Data-parallel reduction overlaps the last micro-batch's backward, except the last bucket, which can
  only start when backward ends: exposed = max(reduce − backward window, last bucket) when overlapped.
  Without a pipeline, sharded gradients (ZeRO-2/3) are reduced after every micro-batch's backward; under a
  pipeline schedule every stage reduces once per round (`gradient_reductions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stepscope.perfmodel.ops import Cost
from stepscope.spec.system import Accelerator

DEFAULT_BUCKET_MIB = 25.0  # PyTorch DDP's default bucket_cap_mb

DISPATCHER_SMS = {"alltoall": 0, "deepep": 20, "deepep-fp8": 20}
"""SMs a MoE dispatcher's kernels hold while they run. DeepEP: 20, DeepSeek-V3's own figure (§3.2.2: "only 20
SMs are sufficient to fully utilize the bandwidths of IB and NVLink"; §3.5.1: "20 out of the 132 SMs available
in the H800 GPU") and the default of Megatron-Core (`moe_deepep_num_sms`) and NeMo AutoModel. HybridEP, which
`deepep` also stands for, runs on 32 in Megatron-Bridge's recipes; none of the validation runs overlaps it.
NCCL's all-to-all runs on SMs too, but on as many channels as NCCL's tuning picks: not modelled (0)."""


@dataclass(frozen=True)
class OpTime:
    """Time of one direction of an op, split into its roofline terms."""

    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s


def op_time(cost: Cost, kind: str, accelerator: Accelerator, precision: str) -> OpTime:
    """Roofline time of one op direction on `accelerator`."""
    if kind == "vector":
        compute = cost.flops / accelerator.vector_peak(precision)
    else:
        efficiency = accelerator.efficiency(cost.flops / max(cost.kernels, 1))
        if kind == "attention":
            efficiency *= accelerator.flash_efficiency
        if precision == "fp8":
            efficiency *= accelerator.fp8_efficiency
        compute = cost.flops / (accelerator.matrix_peak(precision) * efficiency) if cost.flops else 0.0
    memory = cost.bytes / accelerator.memory_bytes_per_s
    return OpTime(compute, memory, cost.kernels * accelerator.kernel_overhead_us * 1e-6)


def exposed(comm_s: float, compute_s: float, overlap: bool) -> float:
    """Communication left on the critical path after overlapping it (or not) with `compute_s`."""
    return max(0.0, comm_s - compute_s) if overlap else comm_s


def dispatcher_sm_share(dispatcher: str, accelerator: Accelerator) -> float:
    """Fraction of the GPU's SMs `dispatcher` holds while it runs (0 where either count is unknown)."""
    sms = DISPATCHER_SMS[dispatcher]
    return min(1.0, sms / accelerator.sm_count) if sms and accelerator.sm_count else 0.0


def overlapped_exchange(exchange_s: float, gemm_s: float, sm_share: float) -> float:
    """What `exchange_s` of expert-parallel exchanges add to the `gemm_s` of GEMMs they overlap, holding
    `sm_share` of the SMs: while they run the GEMMs get 1 − share of the GPU, so the pair takes
    gemm + share·exchange, or the exchange itself once that is longer; max(share·exchange, exchange − gemm)."""
    return max(sm_share * exchange_s, exchange_s - gemm_s)


def bubble(pp: int, interleave: int, per_micro_batch_s: float, rounds: int = 1) -> float:
    """Idle time of the 1F1B schedule: (p−1)/v micro-batch slots, once per pipeline round (a schedule run
    after another fills and drains the pipeline again)."""
    return rounds * (pp - 1) / interleave * per_micro_batch_s


def bucket_layout(total_elements: float, cap_elements: float) -> list[float]:
    """Size-based estimate of gradient buckets: full buckets of `cap_elements`, the remainder last."""
    if total_elements <= 0:
        return []
    full = max(0, math.ceil(total_elements / cap_elements) - 1)
    return [cap_elements] * full + [total_elements - full * cap_elements]


def dp_exposed(bucket_times: Sequence[float], window_s: float, overlap: bool) -> float:
    """Exposed gradient-reduction time: all of it, or what the backward window cannot hide (at least the
    last bucket, which is launched when backward ends)."""
    total = sum(bucket_times)
    if not bucket_times:
        return 0.0
    if not overlap:
        return total
    return max(total - window_s, bucket_times[-1])


def optimizer_bytes_per_param(precision: str, grad_bytes: int) -> float:
    """Adam(W) streams: the gradient, m and v (read + write, fp32), the fp32 master weights (read +
    write) and, in mixed precision, the 16-bit working copy (write)."""
    from stepscope.spec import bytes_per_element

    working = bytes_per_element(precision) if precision != "fp32" else 0
    return grad_bytes + 2 * 8 + 2 * 4 + working


OPTIMIZER_FLOPS_PER_PARAM = 12.0  # Adam: moments, bias corrections, sqrt, division, weight decay, update
OPTIMIZER_KERNELS_PER_TENSOR = 1  # one fused (foreach / multi-tensor) pass per parameter tensor


def optimizer_time(params: float, tensors: int, precision: str, grad_bytes: int,
                   accelerator: Accelerator) -> OpTime:
    """The Adam step over `params` local parameters held in `tensors` tensors."""
    cost = Cost(flops=OPTIMIZER_FLOPS_PER_PARAM * params,
                bytes=params * optimizer_bytes_per_param(precision, grad_bytes),
                kernels=OPTIMIZER_KERNELS_PER_TENSOR * tensors)
    # the update runs in fp32 whatever the model precision (when the system lists an fp32 rate)
    rate = accelerator.vector_peak("fp32" if "fp32" in accelerator.vector_TFLOPps else precision)
    return OpTime(cost.flops / rate, cost.bytes / accelerator.memory_bytes_per_s,
                  cost.kernels * accelerator.kernel_overhead_us * 1e-6)


def zero3_gathers(pp, rounds, micro_batches, backward: bool, reshard_after_forward: bool):
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


def gradient_reductions(pp, rounds, zero, micro_batches):
    """Gradient reductions per step; ints or arrays. Under a pipeline schedule (torch.distributed.pipelining's
    `backward_maybe_with_nosync`; Megatron's 1F1B) gradients accumulate through a round's micro-batches and are
    reduced at its last backward, FSDP's sharded ones too: once per round. Without one, sharded gradients (ZeRO-2/3)
    have no full-size buffer to accumulate micro-batches into: they are reduced after every micro-batch."""
    return np.where(pp > 1, rounds, np.where(zero >= 2, micro_batches, 1))
