"""Collective operations as nccl-tests defines them: names, data types, buffer layouts, the bytes S a
bandwidth is computed from, bus-bandwidth factors, and the data pattern a correctness check verifies.

Backend-neutral and torch-free: the torch and mpi4py op tables (`torch_collectives`, `mpi_rank`) build
their buffers from a `Layout` and fill/verify them with `input_values` / `expected_values`, which work
on numpy arrays and torch tensors alike (integer index arrays in, integer values out).

nccl-tests conventions (see the reference notes):

| op | S (bytes) | busbw factor | count column |
|---|---|---|---|
| all_reduce | per-rank buffer | 2(n-1)/n | buffer elements |
| all_gather | total output (n x input) | (n-1)/n | per-rank elements |
| reduce_scatter | total input (n x output) | (n-1)/n | per-rank elements |
| all_to_all | per-rank send buffer | (n-1)/n | per-peer elements |
| all_to_allv | per-rank send buffer (equal on every rank) | (n-1)/n | mean per-peer elements |
| broadcast, reduce | buffer | 1 | buffer elements |

algbw = S / t and busbw = algbw x factor, in GB/s (1e9 bytes). Requested sizes that do not split into
n equal chunks (all_gather, reduce_scatter, all_to_all, all_to_allv) are rounded down to whole elements
per rank, exactly like nccl-tests' `count/nranks`; `Layout.rounded` says when that happened.

all_to_allv (uneven all-to-all, MoE dispatch) follows `alltoallv_perf` of rccl-tests (ROCm's fork of
nccl-tests, src/alltoallv.cu): every rank sends the same total S, split unevenly over the destinations,
so ranks receive different amounts; algbw = S / t with S = the bytes one rank sends, its own block
included, and busbw = algbw x (n-1)/n, exactly as for all_to_all. rccl-tests splits by a fixed linear
pattern; stepscope's split is a Zipf token-per-expert popularity with a skew, deterministic from a seed
(`splits`). At skew 0 the split is all_to_all's, and so are the numbers. A skewed split is bounded by
the rank that receives most (`imbalance` x S), so its busbw falls below all_to_all's by up to that
factor: the loss the benchmark is there to show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.distributed.collectives.splits import SplitMatrix, displacements, received, split_matrix

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "all_to_allv", "barrier")
REDUCING_OPS = ("all_reduce", "reduce_scatter", "reduce")
ROOTED_OPS = ("broadcast", "reduce")
CHUNKED_OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv")
UNEVEN_OPS = ("all_to_allv",)
"""Ops whose per-peer blocks differ in size (a split matrix, see `splits`)."""


@dataclass(frozen=True)
class CommDtype:
    """A data type a collective moves: stepscope name, nccl-tests name, bytes per element."""

    name: str
    """stepscope name: fp32, bf16, int8, ..."""
    nccl_name: str
    """The nccl-tests `type` column: float, bfloat16, int8, ..."""
    itemsize: int
    """Bytes per element."""
    floating: bool
    """Floating point (else integer)."""


DTYPES: dict[str, CommDtype] = {d.name: d for d in (
    CommDtype("fp32", "float", 4, True), CommDtype("fp16", "half", 2, True), CommDtype("bf16", "bfloat16", 2, True),
    CommDtype("fp64", "double", 8, True), CommDtype("int8", "int8", 1, False), CommDtype("uint8", "uint8", 1, False),
    CommDtype("int32", "int32", 4, False), CommDtype("int64", "int64", 8, False),
)}
# nccl-tests type names (current and NCCL 1 era) -> stepscope names
NCCL_TYPE_NAMES = {d.nccl_name: d.name for d in DTYPES.values()} | {"char": "int8", "int": "int32",
                                                                     "float32": "fp32", "float16": "fp16"}


def comm_dtype(name: str) -> CommDtype:
    """Look a data type up by stepscope name (fp32) or nccl-tests name (float); KeyError if unknown."""
    return DTYPES[NCCL_TYPE_NAMES.get(name, name)]


def busbw_factor(op: str, world_size: int) -> float | None:
    """busbw / algbw for `op` on `world_size` ranks (None for barrier, which moves no payload)."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in CHUNKED_OPS:
        return (n - 1) / n
    if op in ROOTED_OPS:
        return 1.0
    if op == "barrier":
        return None
    raise KeyError(f"unknown collective {op!r}")


def bandwidths_GBps(op: str, size_bytes: int, time_s: float, world_size: int) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s for S = `size_bytes` moved in `time_s`, nccl-tests definitions."""
    factor = busbw_factor(op, world_size)
    if factor is None or time_s <= 0:
        return None, None
    algbw = size_bytes / 1e9 / time_s
    return algbw, algbw * factor


@dataclass(frozen=True)
class Layout:
    """Buffer sizes of one collective call on one rank, derived from a requested byte size."""

    op: str
    """The collective."""
    world_size: int
    """Number of ranks."""
    dtype: str
    """Element type (stepscope name)."""
    requested_bytes: int
    """The size asked for, before rounding."""
    count: int
    """The nccl-tests `count` column: buffer elements (all_reduce, broadcast, reduce) or per-rank chunk
    (all_to_allv: the mean per-peer block, send_count / n)."""
    send_count: int
    """Elements in each rank's input buffer."""
    recv_count: int
    """Elements in each rank's output buffer (all_to_allv: the largest over ranks; see `recv_count_of`)."""
    splits: SplitMatrix | None = None
    """all_to_allv: elements rank src sends to rank dst, [src][dst]; None for the other ops."""

    @property
    def chunk(self) -> int:
        """Elements each rank contributes per peer (chunked ops) or the whole buffer (the others)."""
        return self.count

    @property
    def size_bytes(self) -> int:
        """S, the bytes algbw is computed from (the nccl-tests `size` column)."""
        if self.splits is not None:  # what every rank sends; what a rank receives differs per rank
            return self.send_count * DTYPES[self.dtype].itemsize
        return max(self.send_count, self.recv_count) * DTYPES[self.dtype].itemsize

    def send_splits(self, rank: int) -> tuple[int, ...]:
        """Elements `rank` sends to each rank (all_to_allv)."""
        assert self.splits is not None
        return self.splits[rank]

    def recv_splits(self, rank: int) -> tuple[int, ...]:
        """Elements `rank` receives from each rank (all_to_allv)."""
        assert self.splits is not None
        return received(self.splits, rank)

    def recv_count_of(self, rank: int) -> int:
        """Elements in `rank`'s output buffer."""
        return self.recv_count if self.splits is None else sum(self.recv_splits(rank))

    @property
    def rounded(self) -> bool:
        """True when S is smaller than requested (whole elements, equal chunks per rank)."""
        return self.op != "barrier" and self.size_bytes != self.requested_bytes


def layout(op: str, requested_bytes: int, dtype: str, world_size: int, *, skew: float = 0.0,
           seed: int = 0) -> Layout:
    """Element counts for `op` at `requested_bytes`, rounded down like nccl-tests (count/nranks); `skew`
    and `seed` define all_to_allv's split (see `splits`) and are ignored by the other ops."""
    if op not in OPS:
        raise KeyError(f"unknown collective {op!r}")
    if op == "barrier":
        return Layout(op, world_size, dtype, 0, 0, 0, 0)
    count = requested_bytes // DTYPES[dtype].itemsize
    n = world_size
    if op == "all_gather":
        chunk = count // n
        return Layout(op, n, dtype, requested_bytes, chunk, chunk, chunk * n)
    if op == "reduce_scatter":
        chunk = count // n
        return Layout(op, n, dtype, requested_bytes, chunk, chunk * n, chunk)
    if op == "all_to_all":
        chunk = count // n
        return Layout(op, n, dtype, requested_bytes, chunk, chunk * n, chunk * n)
    if op == "all_to_allv":
        chunk = count // n
        splits = split_matrix(chunk * n, n, float(skew), seed)
        most = max(sum(received(splits, rank)) for rank in range(n))
        return Layout(op, n, dtype, requested_bytes, chunk, chunk * n, most, splits)
    return Layout(op, n, dtype, requested_bytes, count, count, count)


# ---- the data a correctness check verifies -------------------------------------------------------
# Small integers, exact in every dtype (bf16 holds integers up to 256 exactly), so a result either
# equals the expected value or is wrong: no tolerance. Values come from a mixing function of (element,
# rank) modulo the prime 65521, so neither a sum over ranks nor a shift by a whole chunk repeats the
# pattern (a short period such as (7k + 3r) % 5 sums to a constant over 5 ranks and hides misplaced
# elements). Reductions use values 0..4, so a sum over n ranks stays exact up to 4n (n <= 31 in int8);
# moves use 0..96, so data from the wrong rank or the wrong offset differs.
SENTINEL = 111
"""Fill value of output buffers before a check: outside both patterns' ranges, so an unwritten output
element counts as wrong."""


def _mix(index: Any, rank: Any) -> Any:
    return (index * 40503 + rank * 12345) % 65521


def _moved(index: Any, rank: Any) -> Any:
    return _mix(index, rank) % 97


def _summed(index: Any, rank: Any) -> Any:
    return _mix(index, rank) % 5


def input_values(op: str, index: Any, rank: int) -> Any:
    """Values of `rank`'s input buffer at element positions `index` (an integer array)."""
    return _summed(index, rank) if op in REDUCING_OPS else _moved(index, rank)


def expected_values(op: str, index: Any, rank: int, world_size: int, chunk: int, root: int = 0,
                    splits: SplitMatrix | None = None) -> Any:
    """Values `rank`'s output buffer must hold at positions `index` after `op` (integer array);
    all_to_allv needs its `splits`."""
    n = world_size
    if op == "all_to_allv":
        assert splits is not None
        return _received_uneven(index, rank, splits)
    if op in ("all_reduce", "reduce"):
        return sum(_summed(index, r) for r in range(n))
    if op == "reduce_scatter":
        return sum(_summed(rank * chunk + index, r) for r in range(n))
    if op == "broadcast":
        return _moved(index, root)
    source, offset = index // chunk, index % chunk  # which rank's chunk lands at each position
    if op == "all_gather":
        return _moved(offset, source)
    if op == "all_to_all":
        return _moved(rank * chunk + offset, source)
    raise KeyError(f"no output to check for {op!r}")


def _received_uneven(index: Any, rank: int, splits: SplitMatrix) -> Any:
    """all_to_allv: the block from source s starts after the blocks of the sources before it (MPI's
    rdispls) and holds s's send elements from s's displacement towards `rank` on. Built from masks
    summed over the sources, so numpy arrays and torch tensors work alike (n is small)."""
    counts = received(splits, rank)
    values = index * 0
    for source, start in enumerate(displacements(counts)):
        inside = (index >= start) & (index < start + counts[source])
        sent_from = displacements(splits[source])[rank]  # where the block sits in the source's send buffer
        values = values + inside * _moved(index - start + sent_from, source)
    return values


def checked_on(op: str, rank: int, root: int) -> bool:
    """Whether `rank` has a defined output to verify (reduce defines it on the root only)."""
    return op != "barrier" and (op != "reduce" or rank == root)
