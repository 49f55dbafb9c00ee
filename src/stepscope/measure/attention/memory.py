"""Memory of one attention call: peak bytes allocated during forward and during backward, and the bytes
autograd keeps for backward.

- CUDA: the caching allocator's own peak counter (`torch.cuda.max_memory_allocated`), reset per phase.
- CPU: PyTorch has no allocator statistics, so the run happens under `measure.allocations`'
  `track_allocations` (torch.profiler's allocator reports, also for buffers that C++ kernels such as
  SDPA's allocate internally, replayed in time order; a free matched to its allocation by address). The
  profiler only sees the calling thread, so the CPU run uses one intra-op thread (and flash-torch runs
  its tiles on the calling thread while a profiler records): the peak of the same work, with one set
  of tile buffers instead of one per worker thread.
- Saved for backward: `torch.autograd.graph.saved_tensors_hooks` sees every tensor an autograd node
  saves (custom Functions' `save_for_backward` included); unique storages are counted once.

Peaks are relative to what was allocated before the call (the inputs and dO are not counted); the
backward peak includes what the forward left alive for it. A small helper of the attention benchmark;
`stepscope memory` (measure/memory*.py) owns the general memory tooling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from stepscope.measure.allocations import track_allocations
from stepscope.measure.device import cpu_threads, synchronize

_PHASE_MARK = "stepscope::attention_backward"
MIB = 2 ** 20


@dataclass(frozen=True)
class AttentionMemory:
    """Bytes of one forward (+ backward) call."""

    fwd_peak_bytes: int
    """Peak allocated during the forward, above the bytes allocated before it."""
    bwd_peak_bytes: int | None
    """Peak allocated during the backward, above the bytes allocated before the forward (None: no backward)."""
    saved_bytes: int
    """Unique storages autograd saved for backward (inputs and output included)."""
    saved_beyond_inputs_bytes: int
    """The same without the storages of q, k and v."""

    def metrics(self) -> dict[str, float]:
        out = {"fwd_peak_MiB": self.fwd_peak_bytes / MIB, "saved_MiB": self.saved_bytes / MIB,
               "saved_beyond_inputs_MiB": self.saved_beyond_inputs_bytes / MIB}
        if self.bwd_peak_bytes is not None:
            out["bwd_peak_MiB"] = self.bwd_peak_bytes / MIB
        return out


class SavedTensorBytes:
    """Context manager: unique bytes of the tensors autograd saves for backward inside it."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self) -> SavedTensorBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def total(self, exclude: tuple[torch.Tensor, ...] = ()) -> int:
        skip = {t.untyped_storage().data_ptr() for t in exclude}
        return sum(nbytes for ptr, nbytes in self.storages.items() if ptr not in skip)


def measure_attention_memory(forward: Callable[[], torch.Tensor], backward: Callable[[torch.Tensor], None] | None,
                             inputs: tuple[torch.Tensor, ...], device: torch.device) -> AttentionMemory:
    """Run `forward()` (and `backward(out)`) once and report its memory; `inputs` are q, k, v."""
    if device.type == "cuda":
        return _cuda_memory(forward, backward, inputs, device)
    return _cpu_memory(forward, backward, inputs)


def _cuda_memory(forward, backward, inputs, device) -> AttentionMemory:
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with SavedTensorBytes() as saved:
        out = forward()
    synchronize(device)
    fwd_peak = torch.cuda.max_memory_allocated(device) - base
    bwd_peak = None
    if backward is not None:
        torch.cuda.reset_peak_memory_stats(device)
        backward(out)
        synchronize(device)
        bwd_peak = torch.cuda.max_memory_allocated(device) - base
    return AttentionMemory(fwd_peak, bwd_peak, saved.total(), saved.total(exclude=inputs))


def _cpu_memory(forward, backward, inputs) -> AttentionMemory:
    # the profiler-based tracker only sees the calling thread: one intra-op thread (see the docstring)
    with cpu_threads(1), track_allocations("cpu") as trace:
        with SavedTensorBytes() as saved:
            out = forward()
        if backward is not None:
            with record_function(_PHASE_MARK):
                backward(out)
        del out
    boundary = next((start for name, start, _ in trace.ranges if name == _PHASE_MARK), None)
    if boundary is None:
        fwd_peak, bwd_peak = trace.peak_bytes, None
    else:
        # what the forward left alive counts from the backward's start (peak_between includes it)
        fwd_peak = trace.peak_between(0.0, boundary)
        bwd_peak = trace.peak_between(boundary, trace.duration_s)
    return AttentionMemory(fwd_peak, bwd_peak, saved.total(), saved.total(exclude=inputs))
