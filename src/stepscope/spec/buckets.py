"""The gradient-bucket planner: which parameters are all-reduced together, in which order.

Pure Python (torch is never imported here): the DDP wrappers, the performance model and the in-network
aggregation issue all call it, the last two with plain lists.

    plan = plan_buckets([(name, numel, dtype), ...], cap_mb=25, rule="torch")   # registration order
    plan = plan_buckets(model, cap_mb=25)                                          # or a module

Parameters are taken in REVERSE registration order, the order in which their gradients become ready in
backward for a model that registers its layers in forward order (PyTorch DDP's assumption too). Buckets
are returned in launch order; each bucket lists its parameters in that reverse order. Tensors of
different dtypes never share a bucket (a bucket is one flat buffer); each dtype fills its own bucket.

Two rules:
- `torch`: PyTorch DDP's `compute_bucket_assignment_by_size`: a tensor joins the open bucket of its dtype,
  and the bucket closes once it holds at least the cap (so buckets usually exceed the cap a little).
  PyTorch uses a 1 MiB cap for the first bucket when `bucket_cap_mb` is left at its default; pass
  `first_cap_mb=1` to model that (explicit caps apply to every bucket, as measured on torch 2.13).
- `strict`: a bucket never exceeds the cap; a tensor that does not fit closes the open bucket and
  starts the next one, and a tensor larger than the cap forms a bucket of its own.
`cap_mb=None` puts every tensor of a dtype into one bucket. Caps are MiB (2**20 bytes), as in PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError

RULES = ("torch", "strict")
MiB = 1024 * 1024

# element sizes by dtype name; torch dtypes are accepted through their str() ("torch.float32")
_DTYPE_BYTES = {"float64": 8, "double": 8, "fp64": 8, "float32": 4, "float": 4, "fp32": 4, "tf32": 4,
                "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "int64": 8, "long": 8,
                "int32": 4, "int": 4, "int16": 2, "uint8": 1, "int8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "fp8": 1, "bool": 1}


def dtype_name(dtype: Any) -> str:
    """Canonical short name of a dtype given as a torch dtype or a string: `torch.float32` -> `float32`."""
    name = str(dtype).removeprefix("torch.")
    return {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
            "fp64": "float64", "double": "float64"}.get(name, name)


def element_bytes(dtype: Any) -> int:
    """Bytes of one element of `dtype` (a torch dtype or a name such as `float32`, `fp32`, `bf16`)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r} for bucket planning") from None


@dataclass(frozen=True)
class TensorEntry:
    """One gradient tensor to place: its parameter name, element count and dtype."""

    name: str
    """Parameter name (as in `named_parameters()`)."""
    numel: int
    """Number of elements."""
    dtype: str
    """Canonical dtype name (`float32`, `bfloat16`, ...)."""

    @property
    def nbytes(self) -> int:
        return self.numel * element_bytes(self.dtype)


@dataclass(frozen=True)
class Bucket:
    """One all-reduce: tensors reduced together through one flat buffer."""

    index: int
    """Launch order (0 is launched first)."""
    names: tuple[str, ...]
    """Parameter names in the bucket, in the order they become ready (reverse registration order)."""
    numels: tuple[int, ...]
    """Element count of each tensor, aligned with `names`."""
    dtype: str
    """The dtype shared by every tensor of the bucket."""

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def nbytes(self) -> int:
        return self.numel * element_bytes(self.dtype)


def module_entries(module: Any) -> list[TensorEntry]:
    """The trainable parameters of a torch module in registration order (tied parameters once, frozen
    parameters left out: they have no gradient to communicate)."""
    return [TensorEntry(name, int(p.numel()), dtype_name(p.dtype))
            for name, p in module.named_parameters() if p.requires_grad]


def _entries(tensors: Any) -> list[TensorEntry]:
    if hasattr(tensors, "named_parameters"):
        return module_entries(tensors)
    entries = []
    for item in tensors:
        if isinstance(item, TensorEntry):
            entries.append(item)
            continue
        try:
            name, numel, dtype = item
        except (TypeError, ValueError):
            raise UsageError(f"bucket planner expects (name, numel, dtype) items, got {item!r}") from None
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
            raise UsageError(f"tensor {name!r} has an invalid element count {numel!r}")
        element_bytes(dtype)  # validates the dtype
        entries.append(TensorEntry(str(name), numel, dtype_name(dtype)))
    return entries


def _cap_bytes(cap_mb: float | None, option: str) -> float:
    if cap_mb is None:
        return float("inf")
    if isinstance(cap_mb, bool) or not isinstance(cap_mb, (int, float)) or not cap_mb > 0:
        raise UsageError(f"{option} must be a positive number of MiB or None, got {cap_mb!r}")
    return float(cap_mb) * MiB


def plan_buckets(tensors: Any, cap_mb: float | None = 25.0, rule: str = "torch", *,
                 first_cap_mb: float | None = None) -> list[Bucket]:
    """Bucket layout in launch order for `tensors` (a module, or (name, numel, dtype) items in registration
    order) under `cap_mb` and `rule` (see the module docstring)."""
    if rule not in RULES:
        raise UsageError(f"unknown bucket rule {rule!r}; choose {'|'.join(RULES)}")
    cap = _cap_bytes(cap_mb, "bucket cap")
    first_cap = cap if first_cap_mb is None else _cap_bytes(first_cap_mb, "first bucket cap")
    ordered = list(reversed(_entries(tensors)))
    closed: list[tuple[int, list[TensorEntry]]] = []  # (ready position of the last tensor, tensors)
    open_buckets: dict[str, tuple[list[TensorEntry], int, int]] = {}  # dtype -> (tensors, bytes, last position)
    closed_per_dtype: dict[str, int] = {}

    def close(dtype: str) -> None:
        members, _, last = open_buckets.pop(dtype)
        closed.append((last, members))
        closed_per_dtype[dtype] = closed_per_dtype.get(dtype, 0) + 1

    for position, entry in enumerate(ordered):
        members, size, _ = open_buckets.get(entry.dtype, ([], 0, position))
        limit = first_cap if closed_per_dtype.get(entry.dtype, 0) == 0 else cap
        if rule == "strict" and members and size + entry.nbytes > limit:
            close(entry.dtype)  # it does not fit: the open bucket launches without it
            members, size, limit = [], 0, cap
        open_buckets[entry.dtype] = (members + [entry], size + entry.nbytes, position)
        # torch: close once the cap is reached; strict: close when exactly full or holding one larger tensor
        if size + entry.nbytes >= limit:
            close(entry.dtype)
    for dtype in list(open_buckets):
        close(dtype)
    # a bucket can launch once its last tensor is ready, so launch order is the order of last tensors
    # (within one dtype this is simply the order in which buckets closed)
    closed.sort(key=lambda item: item[0])
    return [Bucket(index, tuple(e.name for e in members), tuple(e.numel for e in members), members[0].dtype)
            for index, (_, members) in enumerate(closed)]


def bucket_numels(buckets: Iterable[Bucket]) -> list[int]:
    """Elements per bucket, in launch order (what one step all-reduces, call by call)."""
    return [bucket.numel for bucket in buckets]


def describe(buckets: Sequence[Bucket]) -> str:
    """`13 buckets: 12 x 7,087,872 + 1 x 39,385,344 elements` (sizes grouped, launch order kept)."""
    if not buckets:
        return "0 buckets"
    groups: list[list[int]] = []
    for numel in bucket_numels(buckets):
        if groups and groups[-1][0] == numel:
            groups[-1][1] += 1
        else:
            groups.append([numel, 1])
    parts = " + ".join(f"{count} x {numel:,}" for numel, count in groups)
    return f"{len(buckets)} bucket{'s' if len(buckets) != 1 else ''}: {parts} elements"
