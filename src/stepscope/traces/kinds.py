"""What a GPU event of a trace is: HolisticTraceAnalysis's kernel type (communication, memory, computation, other),
stepscope's category (`stepscope.measure.categories`) and, for a collective, its kind (all_reduce, ...).

HTA's types are reimplemented from its documented behaviour so that idle / compute / non-compute time agree with
it: communication = names starting `nccl...Kernel`; memory = names starting Memcpy, Memset or dma; computation =
everything else except names containing Memcpy or Sync (stream and context syncs), which are `other`.

The categories are stepscope's own table first; GPU library kernels it does not know (cuDNN convolutions and batch
norm, ROCm's Tensile GEMMs, pooling, layout transforms) are matched by `GPU_RULES` below, so `other` stays small.
"""

from __future__ import annotations

import re
from functools import lru_cache

from stepscope.measure.categories import categorize

HTA_TYPES = ("computation", "communication", "memory", "other")
_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"^Memcpy|^Memset|^dma")
_NOT_COMPUTE = re.compile(r"^nccl.*Kernel|.*Memcpy|^Memset|.*Sync")

# (category, regex): GPU library kernels that `measure.categories` leaves unmatched, first match wins
GPU_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((category, re.compile(pattern, re.IGNORECASE)) for
                                                           category, pattern in (
    ("communication", r"^(rccl|msccl)|AllReduce|AllGather|ReduceScatter|SendRecv|AllToAll"),
    ("normalization", r"cudnn::bn_|bn_fw|bn_bw|batchnorm|batch_norm|welford"),
    ("matmul", r"scudnn|cudnn_(infer|train)|dgrad|wgrad|implicit_?gemm|winograd|conv|^Cijk_|rocblas|hipblas|Tensile"
               r"|cask_cudnn|computeOffsets"),
    ("reduction", r"pool|_reduce|reduce_|argmax|topk|segment_sum"),
    ("memory copy", r"nchwToNhwc|nhwcToNchw|permute|transpose|linearize_index|compute_cuda_kernel|jagged|lengths"
                    r"|bounds_check|index|copy|cat_"),
    ("elementwise", r"dropout|distribution_|curand|elementwise|fused|relu|gelu|silu|sigmoid|tanh|add|mul"),
))

_COLLECTIVE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll"
                         r"|Gather|Scatter)", re.IGNORECASE)
_SNAKE = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send", "recv": "recv",
          "alltoall": "all_to_all", "gather": "gather", "scatter": "scatter"}


@lru_cache(maxsize=65536)
def hta_type(name: str) -> str:
    """HTA's kernel type of a GPU event name (see the module docstring)."""
    if _COMM.match(name):
        return "communication"
    if _MEMORY.match(name):
        return "memory"
    if not _NOT_COMPUTE.match(name):
        return "computation"
    return "other"


def core_name(name: str) -> str:
    """A kernel name without its return type, template and argument lists (`void f<T>(fbgemm_gpu::X)` -> `f`);
    `(anonymous namespace)::` is no argument list, and a copy keeps its direction (`Memcpy HtoD (Pageable ->
    Device)`)."""
    if _MEMORY.match(name):
        return name
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    for mark in ("<", "("):
        cut = name.find(mark)
        if cut > 0:
            name = name[:cut]
    return name


@lru_cache(maxsize=65536)
def kernel_category(name: str) -> str:
    """stepscope's category of a GPU event name: `communication` for an NCCL kernel (`^nccl.*Kernel`, whatever its
    name says besides: `ncclAllReduceRingLLKernel_sum_f32` is no reduction); else the shared table, then
    `GPU_RULES`, on the kernel's own name first (its template and argument lists name types and namespaces, e.g.
    `fbgemm_gpu::`, not the work), then on the whole name; else `other`."""
    if _COMM.match(name):
        return "communication"
    for text in dict.fromkeys((core_name(name), name)):
        category = categorize(text)
        if category is not None:
            return category
        for category, pattern in GPU_RULES:
            if pattern.search(text):
                return category
    return "other"


@lru_cache(maxsize=4096)
def collective_kind(name: str) -> str | None:
    """`all_reduce`, `all_gather`, ... for a communication kernel whose name says which, else None. NCCL's names
    through its versions: `ncclAllReduceRingLLKernel_sum_f32` (before 2.12), `ncclKernel_AllGather_RING_LL_Sum_int8_t`
    (2.12 to 2.18), `ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL` (2.19 on), with the algorithm (RING, TREE, NVLS,
    NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN, PAT) and protocol (LL, LL128, SIMPLE) after the operation; point to
    point (and all-to-all, built on it) is `ncclDevKernel_SendRecv`; RCCL adds `AllToAllPivot`. The first operation
    word in the name decides (`ReduceScatter` before `Reduce`, `SendRecv` before `Send`)."""
    match = _COLLECTIVE.search(name)
    return _SNAKE.get(match.group(1).lower()) if match else None
