"""What overlapping a tensor-parallel collective with its GEMM really costs (`--tp-overlap`), as each stack
decomposes the pair (Transformer Engine's userbuffers, PyTorch's symmetric-memory async TP): the chunked GEMMs'
tiling, the transfer that cannot hide and the SMs the communication takes are charged to the tensor-parallel
exchange. Over numpy arrays. Both need sequence parallelism: an all-reduce never hides.

The decompositions and their sources: docs/model.md, "The training stack" (overlapped tensor parallelism).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.op_types import Collective, Cost
from stepscope.perfmodel.model.rates import chunked_compute
from stepscope.spec.system import Accelerator, Network

PIPELINE_SPLITS = 4
"""Transformer Engine's GEMM + reduce-scatter splits (`num_splits = 4` for proj_fprop, fc2_fprop)."""
COMM_SMS = 16
"""SMs Transformer Engine's pipelined and bulk overlaps give the communication (`num_sm = 16`, set_sm_margin)."""
STREAMS = {"userbuffers": 3, "async-tp": 2}
"""Compute streams the chunk GEMMs run on, so that consecutive chunks share the GPU's waves: Transformer Engine's
`CommOverlapP2PBase` keeps up to 3 (`_stream_compute`, NVTE_COMM_OVERLAP_MAX_STREAMS), PyTorch's async TP alternates
2 ("the strategy allows for computation/computation overlapping, greatly reducing quantization inefficiency")."""
BARRIER_S = 10e-6
"""One cross-GPU barrier of PyTorch's async TP (an estimate of 5-10 µs: a GPU measurement would settle it)."""


def overlapped_tp(comm: Collective, cost: Cost, compute_s: Any, direction: str, g: Any, network: Network,
                  accelerator: Accelerator, precision: str, act_bytes: int, implementation: str) -> Any:
    """Seconds a tensor-parallel collective and its GEMM show beyond the plain GEMM (`compute_s`), overlapped by
    `implementation` (`spec.stack.StackSpec.tensor_overlap`); `g` of the group's ranks share a fast domain."""
    collective = comm.seconds(g, network)
    if comm.kind == "all-reduce" or not cost.gemms:
        return collective
    return np.where(comm.runs, _decomposed(comm, cost, compute_s, direction, collective, accelerator, precision,
                                           act_bytes, implementation), 0.0)


def _decomposed(comm: Collective, cost: Cost, compute_s: Any, direction: str, collective: Any,
                accelerator: Accelerator, precision: str, act_bytes: int, implementation: str) -> Any:
    """`overlapped_tp` of a collective that runs: the pair's time beyond the plain GEMM."""
    tp = np.maximum(comm.size, 1)
    sms = accelerator.sm_count or 132
    if comm.kind == "all-gather":
        chunk = chunked_compute(cost, accelerator, precision, tp, STREAMS[implementation]) / tp
        ring = chunk + (tp - 1) * np.maximum(chunk, collective / np.maximum(tp - 1, 1))
        if implementation == "async-tp":
            ring = ring + BARRIER_S + comm.bytes / tp / accelerator.memory_bytes_per_s
        return np.maximum(0.0, ring - compute_s)
    if implementation == "userbuffers":
        if direction == "backward":  # bulk: beside the weight-gradient GEMM on the SMs left
            return np.maximum(0.0, np.maximum(compute_s * sms / (sms - COMM_SMS), collective) - compute_s)
        splits = chunked_compute(cost, accelerator, precision, PIPELINE_SPLITS, STREAMS[implementation]) * sms / (
            sms - COMM_SMS)
        return np.maximum(0.0, splits + collective / PIPELINE_SPLITS - compute_s)
    chunk = chunked_compute(cost, accelerator, precision, tp, STREAMS[implementation]) / tp
    m, n = cost.gemms[0][0], cost.gemms[0][1]
    partials = (m * n + m * n / tp) * act_bytes / accelerator.memory_bytes_per_s
    steps = (tp - 1) * np.maximum(chunk, collective / np.maximum(tp - 1, 1) + BARRIER_S)
    return np.maximum(0.0, steps + chunk + partials - compute_s)
