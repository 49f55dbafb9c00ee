"""The naive attention's three pieces, measured in a profile: score matmul, softmax, value matmul.

For each piece: its time, FLOPs and bytes moved, and the achieved FLOP/s and bytes/s, so one sees the
softmax is memory-bound (about one FLOP per byte) while the matmuls do Dh/2-ish FLOPs per byte or more.
FLOPs and bytes come from the shapes and dtypes the profiler recorded for each call, summed over
layers; per call, with B batch, H heads, S sequence, Dh head dimension and e bytes per element:

- score matmul  Q·Kᵀ : 2·B·H·S·S·Dh FLOPs;  bytes (2·B·H·S·Dh + B·H·S·S)·e   (read Q, K; write scores)
- softmax            : 5·B·H·S·S FLOPs (max, subtract, exp, sum, divide per element, exp counted as one);
                       bytes 2·B·H·S·S·e                                    (read scores; write probabilities)
- value matmul  P·V  : 2·B·H·S·S·Dh FLOPs;  bytes (B·H·S·S + 2·B·H·S·Dh)·e   (read P, V; write output)

Bytes are the minimum traffic (each operand read once, the result written once); the naive attention
computes the full S x S square, so these are not halved for the causal mask. Time is the op's inclusive
time (CPU) or its kernels' device time (CUDA).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stepscope.measure.profile.events import PhaseRange
from stepscope.results.tables import Table

PIECES: tuple[str, ...] = ("score matmul", "softmax", "value matmul")
SOFTMAX_FLOPS_PER_ELEMENT = 5
_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "c10::Float8_e4m3fn": 1,
                  "c10::Float8_e5m2": 1}


def matmul_flops(a: Sequence[int], b: Sequence[int]) -> float:
    """2·batch·m·k·n for (..., m, k) @ (..., k, n)."""
    *batch, m, k = a
    return 2.0 * math.prod(batch) * m * k * b[-1]


def matmul_bytes(a: Sequence[int], b: Sequence[int], element: int) -> float:
    """Read both operands, write the (..., m, n) result once."""
    *batch, m, _ = a
    return float(math.prod(a) + math.prod(b) + math.prod(batch) * m * b[-1]) * element


def softmax_flops(shape: Sequence[int]) -> float:
    return float(SOFTMAX_FLOPS_PER_ELEMENT * math.prod(shape))


def softmax_bytes(shape: Sequence[int], element: int) -> float:
    return 2.0 * math.prod(shape) * element


def _element_bytes(event: Any) -> int | None:
    dtypes = getattr(event, "input_dtypes", None) or []
    return _ELEMENT_BYTES.get(dtypes[0]) if dtypes else None


def _is_4d(shape: Any) -> bool:
    return isinstance(shape, (list, tuple)) and len(shape) == 4


def find_pieces(events: Sequence[Any], ranges: Sequence[PhaseRange]) -> dict[str, list[Any]]:
    """The naive attention's forward calls, by piece. Needs a profile with `record_shapes=True`.

    The backend calls torch.matmul on 4-D (batch, heads, ...) tensors twice per layer, scores first:
    matmuls of two 4-D inputs in the forward ranges alternate score, value (the projections are 3-D).
    """
    forward = [r for r in ranges if r.phase == "forward"]

    def in_forward(event: Any) -> bool:
        return any(r.start_us <= event.time_range.start <= r.end_us for r in forward)

    host = [e for e in events if str(e.device_type).endswith("CPU") and in_forward(e)]
    host.sort(key=lambda e: e.time_range.start)
    matmuls = [e for e in host if e.name == "aten::matmul" and len(e.input_shapes) >= 2
               and _is_4d(e.input_shapes[0]) and _is_4d(e.input_shapes[1])]
    softmaxes = [e for e in host if e.name == "aten::softmax" and e.input_shapes and _is_4d(e.input_shapes[0])]
    return {"score matmul": matmuls[0::2], "softmax": softmaxes, "value matmul": matmuls[1::2]}


def attention_pieces_table(events: Sequence[Any], ranges: Sequence[PhaseRange], steps: int,
                           device_type: str) -> Table:
    """One row per piece: per-step time, FLOPs, bytes and achieved rates (summed over layers)."""
    rows = []
    for piece, calls in find_pieces(events, ranges).items():
        flops = bytes_moved = seconds = 0.0
        for event in calls:
            shapes = event.input_shapes
            element = _element_bytes(event) or 0
            if piece == "softmax":
                flops += softmax_flops(shapes[0])
                bytes_moved += softmax_bytes(shapes[0], element)
            else:
                flops += matmul_flops(shapes[0], shapes[1])
                bytes_moved += matmul_bytes(shapes[0], shapes[1], element)
            seconds += (event.device_time_total if device_type == "cuda" else event.cpu_time_total) / 1e6
        flops, bytes_moved, seconds = flops / steps, bytes_moved / steps, seconds / steps
        rows.append({"piece": piece, "calls_per_step": len(calls) / steps, "time_ms": 1e3 * seconds,
                     "flops": flops, "bytes": bytes_moved,
                     "TFLOPps": flops / seconds / 1e12 if seconds else None,
                     "GBps": bytes_moved / seconds / 1e9 if seconds else None,
                     "FLOP_per_byte": flops / bytes_moved if bytes_moved else None})
    title = "naive attention pieces: forward, all layers, per step (softmax < 1 FLOP/byte: memory-bound)"
    return Table("profile-attention", title, ("piece",), rows)
