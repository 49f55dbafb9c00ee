"""The points of a collective sweep: what one measurement is (`CommPoint`), the record config it is
stored under, and the grid a request expands to, with nccl-tests-style rounding reported. Pure Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.distributed.collectives.ops import CHUNKED_OPS, ROOTED_OPS, UNEVEN_OPS, Layout, layout
from stepscope.distributed.collectives.sizes import format_bytes

CALL_MODES = ("per-op", "batch")
"""per-op: every call waited (and the device synchronized) before the next; batch: `iters` async calls
in flight, then one wait, like nccl-tests' timed loop."""
PLACES = ("out", "in")
"""out: separate send and receive buffers; in: the result overwrites the input (nccl-tests in-place)."""


@dataclass(frozen=True)
class CommPoint:
    """One measured point: a collective at one size on one backend, world size, dtype, mode, placement."""

    backend: str
    """gloo, nccl, mpi or oneccl."""
    op: str
    """all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, all_to_allv or barrier."""
    world_size: int
    """Number of ranks."""
    requested_bytes: int
    """The size asked for; S may be smaller after rounding (see `layout`)."""
    dtype: str
    """Element type (stepscope name: fp32, bf16, int8, ...)."""
    mode: str
    """per-op or batch (see CALL_MODES)."""
    in_place: bool | None
    """True for in-place, False for out-of-place, None for barrier (no buffers)."""
    iters: int
    """Timed calls."""
    warmup: int
    """Untimed calls before timing, at this size."""
    root: int = 0
    """Source (broadcast) or destination (reduce) rank."""
    skew: float = 0.0
    """all_to_allv: Zipf exponent of the token-per-expert popularity (0: equal split); see `splits`."""
    seed: int = 0
    """all_to_allv: which ranks are the hot ones (every rank derives the same split from it)."""

    def layout(self) -> Layout:
        return layout(self.op, self.requested_bytes, self.dtype, self.world_size, skew=self.skew, seed=self.seed)

    def config(self) -> dict[str, Any]:
        """The record config (also the resume key): everything that defines the measurement."""
        lay = self.layout()
        config: dict[str, Any] = {"record": "point", "backend": self.backend, "op": self.op,
                                  "world_size": self.world_size, "size_bytes": lay.size_bytes,
                                  "requested_bytes": self.requested_bytes, "count": lay.count, "dtype": self.dtype,
                                  "mode": self.mode, "in_place": self.in_place, "iters": self.iters,
                                  "warmup": self.warmup}
        if self.op in ROOTED_OPS:
            config["root"] = self.root
        if self.op in UNEVEN_OPS:  # only here, so the keys of the other ops' records stay as they were
            config["skew"], config["seed"] = self.skew, self.seed
        return config

    def label(self) -> str:
        place = "" if self.in_place is None else (" in-place" if self.in_place else " out-of-place")
        size = "" if self.op == "barrier" else f" {format_bytes(self.layout().size_bytes)}B"
        skew = f" skew {self.skew:g}" if self.op in UNEVEN_OPS else ""
        return f"{self.backend} {self.op}{size}{skew} {self.dtype} {self.mode}{place} on {self.world_size} ranks"


@dataclass(frozen=True)
class Rounding:
    """A requested size that nccl-tests' rules shrink for an op and world size."""

    op: str
    world_size: int
    dtype: str
    requested_bytes: int
    size_bytes: int

    def message(self) -> str:
        why = (f"{self.world_size} equal chunks of whole {self.dtype} elements" if self.op in CHUNKED_OPS
               else f"whole {self.dtype} elements")
        if self.op in UNEVEN_OPS:
            why = f"a multiple of {self.world_size} whole {self.dtype} elements"
        return (f"{self.op} on {self.world_size} ranks: {self.requested_bytes} B rounded down to "
                f"{self.size_bytes} B ({why}, like nccl-tests)")


def plan_points(*, backend: str, world_size: int, ops: Sequence[str], sizes: Sequence[int], dtypes: Sequence[str],
                modes: Sequence[str], places: Sequence[str], iters: int, warmup: int, root: int = 0,
                skews: Sequence[float] = (0.0,), seed: int = 0) -> tuple[list[CommPoint], list[Rounding], list[str]]:
    """Every point of the grid for one backend and world size, plus the roundings and the sizes skipped
    because they round to zero elements (as notes). all_to_allv has one point per skew in `skews`."""
    points: list[CommPoint] = []
    roundings: list[Rounding] = []
    skipped: list[str] = []
    for op, dtype, mode in itertools.product(ops, dtypes, modes):
        if op == "barrier":
            if dtype == dtypes[0]:  # a barrier moves no data: one point per mode, whatever the dtypes
                points.append(CommPoint(backend, op, world_size, 0, dtype, mode, None, iters, warmup, root))
            continue
        for size in sizes:
            lay = layout(op, size, dtype, world_size)
            if lay.count == 0:
                skipped.append(f"{op} on {world_size} ranks: {size} B is less than one {dtype} element per rank; "
                               "skipped")
                continue
            if lay.rounded:
                roundings.append(Rounding(op, world_size, dtype, size, lay.size_bytes))
            for skew, place in itertools.product(skews if op in UNEVEN_OPS else (0.0,), places):
                points.append(CommPoint(backend, op, world_size, size, dtype, mode, place == "in", iters, warmup,
                                        root, float(skew), seed))
    return points, list(dict.fromkeys(roundings)), list(dict.fromkeys(skipped))
