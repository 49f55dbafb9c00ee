"""NCCL kernel names through NCCL's versions (and RCCL's) get their collective kind, the communication category and
HTA's communication type; kernels that only look alike do not."""

from __future__ import annotations

import pytest

from stepscope.traces.kinds import collective_kind, hta_type, kernel_category

NCCL_NAMES = [
    # NCCL >= 2.19: ncclDevKernel_<Op>[_<RedOp>_<type>]_<algorithm>[_<protocol>]
    ("ncclDevKernel_AllReduce_Sum_f32_NVLS", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_f16_NVLS_TREE", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_bf16_COLLNET_DIRECT", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_u8_COLLNET_CHAIN", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL128", "all_reduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS", "reduce_scatter"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_PAT", "reduce_scatter"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_COLLNET_DIRECT", "reduce_scatter"),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("ncclDevKernel_AllGather_NVLS", "all_gather"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
    ("ncclDevKernel_Reduce_Sum_bf16_TREE_LL", "reduce"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
    # NCCL 2.12 - 2.18: ncclKernel_<Op>_<algorithm>_<protocol>_<RedOp>_<type>
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all_gather"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "send_recv"),
    # before NCCL 2.12: nccl<Op><Algorithm><Protocol>Kernel_<redop>_<type>
    ("ncclAllReduceRingLLKernel_sum_f32(ncclWorkElem)", "all_reduce"),
    ("ncclReduceScatterRingLL128Kernel_sum_bf16(ncclWorkElem)", "reduce_scatter"),
    # RCCL
    ("ncclDevKernel_AllToAllPivot_RING_SIMPLE_Sum_i8", "all_to_all"),
    # a kernel that does not say which collective it runs
    ("ncclDevKernel_Generic_4", None),
]


@pytest.mark.parametrize(("name", "kind"), NCCL_NAMES)
def test_nccl_kernels_are_communication_of_their_kind(name: str, kind: str | None) -> None:
    assert collective_kind(name) == kind
    assert kernel_category(name) == "communication"
    assert hta_type(name) == "communication"


@pytest.mark.parametrize(("name", "category"), [
    ("void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)", "reduction"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "matmul"),
])
def test_look_alikes_are_not_communication(name: str, category: str) -> None:
    assert hta_type(name) == "computation"
    assert kernel_category(name) == category
