"""Kernel time attributed from torch's profiler events, with and without `FunctionEvent.linked_correlation_id`
(torch 2.11, the CUDA build a GPU machine had, lacks it: every kernel's time must still reach its op)."""

from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from stepscope.measure.profile.events import attribute_work
from stepscope.measure.ranges import range_name

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"


def events() -> list[FunctionEvent]:
    """A forward range on the host, two ops in it, and the three kernels they launched on the GPU."""
    forward = FunctionEvent(1, range_name("forward"), 1, 0.0, 1000.0)
    mm = FunctionEvent(5, "aten::mm", 1, 10.0, 20.0)
    softmax = FunctionEvent(6, "aten::_softmax", 1, 30.0, 35.0)
    kernels = [FunctionEvent(100, GEMM, 7, 40.0, 140.0, device_type=DeviceType.CUDA, linked_correlation_id=5),
               FunctionEvent(101, GEMM, 7, 150.0, 200.0, device_type=DeviceType.CUDA, linked_correlation_id=5),
               FunctionEvent(102, "softmax_warp_forward", 7, 210.0, 215.0, device_type=DeviceType.CUDA,
                             linked_correlation_id=6)]
    for op, kernel in ((mm, kernels[0]), (mm, kernels[1]), (softmax, kernels[2])):
        op.append_kernel(kernel.name, 0, kernel.time_range.end - kernel.time_range.start)
    for child in (mm, softmax):
        forward.append_cpu_child(child)
        child.set_cpu_parent(forward)
    return [forward, mm, softmax, *kernels]


def summary(work) -> list[tuple]:
    return sorted((w.phase, w.category, w.op, round(w.seconds * 1e6, 6)) for w in work)


def test_kernels_reach_their_op_with_and_without_the_linked_id():
    linked = summary(attribute_work(events(), "cuda"))
    assert sorted(seconds for *_, seconds in linked) == [5.0, 50.0, 100.0]
    assert {phase for phase, *_ in linked} == {"forward"}
    assert {category for _, category, *_ in linked} == {"matmul", "softmax"}, linked
    unlinked = events()
    for event in unlinked:
        del event.linked_correlation_id  # what torch 2.11's FunctionEvent looks like
    assert summary(attribute_work(unlinked, "cuda")) == linked
