"""From the profiler's events to attributed work: every slice of profiled time with its phase, its category
and the op it is charged to.

What counts as time:
- CPU: each op's self time (its time minus its children's), so nested ops are never counted twice and the
  slices of a phase add up to the time ops ran inside that phase's range;
- CUDA: each kernel's (or memcpy's) device time, charged to the CPU op that launched it.

Which phase: the `stepscope.<phase>` range (see `TrainingStep.run(region=...)`) whose interval contains
the op's start (the launching op's, for kernels), on any thread: CUDA backward ops run on autograd's
device thread, outside the main thread's call tree but inside the range's interval.

Which category (see `categories.py`): the outermost op of the call chain that a rule matches. A backward
node first takes the category of the forward op that created it (matched by autograd sequence number),
so the multiplies of a composite RMSNorm stay normalization in the backward pass too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.measure.categories import (
    EVALUATE_PREFIX,
    categorize,
    is_autograd_node,
    normalize_name,
)
from stepscope.measure.ranges import PHASES, RANGE_PREFIX, range_name

MOE_RANGE_PREFIX = RANGE_PREFIX + "moe."
"""`stepscope.nn.moe.MOE_RANGE_PREFIX` (profile reads the names; it does not import the model)."""

PHASE_GROUPS: dict[str, tuple[str, ...]] = {"fwd": ("forward",), "fwd-bwd": ("forward", "backward"),
                                            "train": ("forward", "backward", "optimizer")}
"""Cumulative phase groups, named like the workload modes: forward, forward+backward, the full train step."""
GROUP_TITLES: dict[str, str] = {"fwd": "forward", "fwd-bwd": "forward+backward", "train": "train step"}


@dataclass(frozen=True)
class Work:
    """One slice of profiled time: an op's self time (CPU) or one kernel (CUDA)."""

    phase: str
    category: str
    op: str
    """What the time is charged to: the outermost op of the call chain (CPU, see `op_of`) or the kernel."""
    seconds: float
    call: int
    """Identity of one call of `op` (slices with equal `call` are one call), for call counts."""
    piece: str | None = None
    """For `moe` work: the piece of the MoE block (router, dispatch, experts, combine, shared)."""


@dataclass(frozen=True)
class PhaseRange:
    """One occurrence of a phase range in the profile (times in microseconds from the trace start)."""

    phase: str
    start_us: float
    end_us: float

    @property
    def seconds(self) -> float:
        return (self.end_us - self.start_us) / 1e6


def phase_ranges(events: Iterable[Any]) -> list[PhaseRange]:
    """The host-side `stepscope.<phase>` ranges, in time order (device-side copies are ignored)."""
    names = {range_name(p): p for p in PHASES}
    found = [PhaseRange(names[e.name], e.time_range.start, e.time_range.end) for e in events
             if e.name in names and _is_host(e)]
    return sorted(found, key=lambda r: r.start_us)


class _PhaseLookup:
    """Which phase range contains a time (ranges do not overlap)."""

    def __init__(self, ranges: Sequence[PhaseRange]) -> None:
        self.ranges = list(ranges)
        self.starts = [r.start_us for r in self.ranges]

    def __call__(self, time_us: float) -> str | None:
        i = bisect.bisect_right(self.starts, time_us) - 1
        if i >= 0 and time_us <= self.ranges[i].end_us:
            return self.ranges[i].phase
        return None


def attribute_work(events: Sequence[Any], device_type: str = "cpu") -> list[Work]:
    """Attribute profiled time to (phase, category, op). `events` are `torch.profiler` FunctionEvents."""
    phase_of = _PhaseLookup(phase_ranges(events))
    classifier = _Classifier(events, phase_of)
    if device_type == "cuda":
        return _kernel_work(events, phase_of, classifier)
    return _host_work(events, phase_of, classifier)


def _host_work(events: Sequence[Any], phase_of: _PhaseLookup, classifier: _Classifier) -> list[Work]:
    """Every host op's self time inside a phase range (the ranges' own time is not op time)."""
    work = []
    for event in events:
        if not _is_host(event) or event.name.startswith(RANGE_PREFIX) or _is_profiler_step(event.name):
            continue
        phase = phase_of(event.time_range.start)
        if phase is None:
            continue
        category, decider = classifier.classify(event)
        op = op_of(event)
        work.append(Work(phase, category, display_name(op.name), event.self_cpu_time_total / 1e6, id(op),
                         moe_piece(category, decider)))
    return work


def _kernel_work(events: Sequence[Any], phase_of: _PhaseLookup, classifier: _Classifier) -> list[Work]:
    """Every kernel's device time, in the phase and category of the op that launched it."""
    if events and not hasattr(events[0], "linked_correlation_id"):
        return _kernel_work_by_op(events, phase_of, classifier)
    # kernels link to the correlation id of the frontend op that launched them (linked id 0 itself);
    # runtime calls such as cudaLaunchKernel carry ids from another counter, so they are left out
    ops_by_id = {e.id: e for e in events if _is_host(e) and not e.linked_correlation_id}
    work = []
    for kernel in events:
        if not _is_device(kernel):
            continue
        op = ops_by_id.get(kernel.linked_correlation_id)
        phase = phase_of(op.time_range.start if op is not None else kernel.time_range.start)
        if phase is None:
            continue
        category = classifier.category(op, extra=kernel.name)
        seconds = (kernel.time_range.end - kernel.time_range.start) / 1e6
        piece = moe_piece(category, classifier.classify(op)[1]) if op is not None else None
        work.append(Work(phase, category, short_name(kernel.name), seconds, id(kernel), piece))
    return work


def _kernel_work_by_op(events: Sequence[Any], phase_of: _PhaseLookup, classifier: _Classifier) -> list[Work]:
    """`_kernel_work` where FunctionEvents do not carry the kernel's link (torch 2.11 has no
    `linked_correlation_id`): every torch release lists on each op the kernels it launched (name, device, µs);
    kernels no op launched are then not seen."""
    work = []
    for op in events:
        # `is_legacy`: kineto without CUPTI gives every op, nested ones too, its CUDA-event time as a pseudo-kernel
        if not _is_host(op) or not op.kernels or getattr(op, "is_legacy", False):
            continue
        phase = phase_of(op.time_range.start)
        if phase is None:
            continue
        for kernel in op.kernels:
            category = classifier.category(op, extra=kernel.name)
            work.append(Work(phase, category, short_name(kernel.name), kernel.duration / 1e6, id(kernel),
                             moe_piece(category, classifier.classify(op)[1])))
    return work


def op_of(event: Any) -> Any:
    """The op a host event's time is charged to: the outermost op of its chain that is not a range
    (`aten::linear` for an `aten::mm` inside it, `aten::addcdiv_` inside `Optimizer.step`, the autograd
    node in the backward pass); a range's own time (e.g. Python inside `Optimizer.step`) stays the range's."""
    chain = _chain(event)
    return next((link for link in chain if not link.is_user_annotation), chain[-1])


class _Classifier:
    """Categories of call chains, with backward nodes mapped to their forward op's category."""

    def __init__(self, events: Sequence[Any], phase_of: _PhaseLookup) -> None:
        self._memo: dict[int, tuple[str, str]] = {}
        # (thread, sequence number, op base name) -> (category, the name that decided it). Every op records the
        # sequence number the NEXT autograd node will get, so several ops share one; the node's own name says
        # which op made it (MaskedFillBackward0 <- aten::masked_fill).
        self.forward_category: dict[tuple[int, int, str], tuple[str, str]] = {}
        for event in events:  # start order: a composite op is seen before its parts, outermost wins
            if (_is_host(event) and event.sequence_nr >= 0 and not is_autograd_node(event.name)
                    and phase_of(event.time_range.start) == "forward"):
                decided = self.classify(event, use_forward=False)
                if decided[0] != "other":
                    key = (event.thread, event.sequence_nr, _base_name(event.name))
                    self.forward_category.setdefault(key, decided)

    def classify(self, event: Any, use_forward: bool = True) -> tuple[str, str]:
        """(category, the name in the chain that decided it; for a backward node, its forward op's) for a
        host event."""
        key = id(event)
        if use_forward and key in self._memo:
            return self._memo[key]
        result: tuple[str, str] | None = None
        for link in _chain(event):
            if use_forward and is_autograd_node(link.name) and link.sequence_nr >= 0:
                node_op = _base_name(normalize_name(link.name))
                result = self.forward_category.get((link.fwd_thread, link.sequence_nr, node_op))
                if result is not None:
                    break
            category = categorize(link.name)
            if category is not None:
                result = (category, link.name)
                break
        if result is None:
            result = ("other", event.name)
        if use_forward:
            self._memo[key] = result
        return result

    def category(self, op: Any | None, extra: str) -> str:
        """Category of a kernel: its launching op's chain first, then the kernel name itself."""
        if op is not None:
            category, _ = self.classify(op)
            if category != "other":
                return category
        return categorize(extra) or "other"


def moe_piece(category: str, decider: str) -> str | None:
    """The MoE piece of `moe` work, from the range that decided its category (`stepscope.moe.experts`)."""
    return decider.removeprefix(MOE_RANGE_PREFIX) if category == "moe" else None


def _chain(event: Any) -> list[Any]:
    """The event and its host-side ancestors, outermost first (profiler step markers dropped)."""
    chain = []
    while event is not None:
        if not _is_profiler_step(event.name):
            chain.append(event)
        event = event.cpu_parent
    return chain[::-1]


def _base_name(name: str) -> str:
    """`aten::_log_softmax` and `aten::log_softmax_` -> `log_softmax`: how a node's op is matched."""
    return name.removeprefix("aten::").strip("_")


def _is_profiler_step(name: str) -> bool:
    return name.startswith("ProfilerStep")


def _is_host(event: Any) -> bool:
    return str(event.device_type).endswith("CPU") and not event.is_async


def _is_device(event: Any) -> bool:
    """A kernel, memcpy or memset on the GPU (not the device-side copy of a record_function range)."""
    return (str(event.device_type).endswith("CUDA") and not event.is_user_annotation
            and "user_annotation" not in str(getattr(event, "activity_type", "")))


def display_name(name: str) -> str:
    """Autograd nodes without the engine's prefix: `MmBackward0`."""
    return name[len(EVALUATE_PREFIX):] if name.startswith(EVALUATE_PREFIX) else name


def short_name(name: str, width: int = 90) -> str:
    """A kernel name cut to `width` characters (C++ template arguments make them very long)."""
    name = name.removeprefix("void ")
    return name if len(name) <= width else name[:width - 3] + "..."
