"""The torch.distributed op table (gloo, nccl, and oneCCL's `ccl` when its bindings are installed) and the
rank function the launcher runs for a collective sweep.

Placement follows the torch API: all_reduce, broadcast and reduce exist only in place (their
out-of-place rows are `unsupported`); all_gather and reduce_scatter have both forms, the in-place one
aliasing the rank's chunk of the big buffer as nccl-tests does; all_to_all_single has no in-place form
(aliased buffers give wrong results on gloo), so that row is `unsupported` too, for all_to_all and for
all_to_allv (all_to_all_single with per-rank split sizes: the same call on gloo and nccl).

Timing exchange and agreement go through a separate gloo group on CPU, so the measured group only
ever carries the measured calls.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from stepscope.distributed.collectives.ops import DTYPES, SENTINEL, checked_on, expected_values, input_values
from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.collectives.rank import Prepared, RankOutcome, chunks, run_points
from stepscope.distributed.launch.rank import RankContext
from stepscope.measure.device import is_out_of_memory

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
                "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}
IN_PLACE_ONLY = ("all_reduce", "broadcast", "reduce")

# torch 2.13 renamed the single-tensor forms; older releases (>= 2.3) have only the old names
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class TorchRankOptions:
    """What the parent tells every rank besides the points."""

    out_dir: str | None
    """Folder of the record store rank 0 appends to (None: do not store)."""
    tally: bool = False
    """Profile a separate pass of each point for the per-backend tables."""
    group_backend: str | None = None
    """Measure a new group of this backend (e.g. `ccl`) instead of the launcher's default group."""
    label: str | None = None
    """Backend name written to records (default: the process group's backend)."""
    timeout_s: float = 300.0
    """Timeout of the groups created here (new_group ignores init_process_group's and waits 30 min)."""


class TorchCommunicator:
    """torch.distributed calls on one rank: the measured group plus a gloo control group."""

    def __init__(self, ctx: RankContext, group: Any = None, label: str | None = None,
                 timeout_s: float = 300.0) -> None:
        self.backend = label or ctx.backend
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.device = torch.device(ctx.device)
        self.group = group
        # collective: every rank creates it, in the same order; the explicit timeout keeps a dead or
        # stuck peer from blocking the others for new_group's default 30 minutes
        self.control = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout_s))
        self._profiler: Any = None
        self._itemsize = 4

    # ---- the op table ----------------------------------------------------------------------------
    def unsupported(self, point: CommPoint) -> str | None:
        if point.dtype not in TORCH_DTYPES:
            return f"dtype {point.dtype} has no torch equivalent"
        if point.op in IN_PLACE_ONLY and point.in_place is False:
            return f"torch.distributed.{point.op} works in place only"
        if point.op in ("all_to_all", "all_to_allv") and point.in_place:
            return "torch all_to_all_single has no in-place form"
        return None

    def prepare(self, point: CommPoint) -> Prepared:
        lay, op, rank, n, root = point.layout(), point.op, self.rank, self.world_size, point.root
        group = self.group
        if op == "barrier":
            return Prepared(start=lambda async_op: dist.barrier(group=group, async_op=async_op))
        dtype = TORCH_DTYPES[point.dtype]
        chunk = lay.chunk

        def new(count: int) -> torch.Tensor:
            return torch.empty(count, dtype=dtype, device=self.device)

        def inp(idx: Any) -> Any:
            return input_values(op, idx, rank)

        def out(idx: Any) -> Any:
            return expected_values(op, idx, rank, n, chunk, root, splits=lay.splits)

        check = checked_on(op, rank, root)
        if op in IN_PLACE_ONLY:
            buf = new(lay.count)
            call = {"all_reduce": lambda a: dist.all_reduce(buf, group=group, async_op=a),
                    "broadcast": lambda a: dist.broadcast(buf, src=root, group=group, async_op=a),
                    "reduce": lambda a: dist.reduce(buf, dst=root, group=group, async_op=a)}[op]
            return Prepared(call, inputs=[(buf, inp)], outputs=[(buf, out)] if check else [])
        if op == "all_gather":
            output = new(lay.recv_count)
            source = output.narrow(0, rank * chunk, chunk) if point.in_place else new(chunk)
            return Prepared(lambda a: _all_gather_single(output, source, group=group, async_op=a),
                            inputs=[(source, inp)], outputs=[(output, out)])
        if op == "reduce_scatter":
            source = new(lay.send_count)
            output = source.narrow(0, rank * chunk, chunk) if point.in_place else new(chunk)
            return Prepared(lambda a: _reduce_scatter_single(output, source, group=group, async_op=a),
                            inputs=[(source, inp)], outputs=[(output, out)])
        if op == "all_to_all":
            source, output = new(lay.send_count), new(lay.recv_count)
            return Prepared(lambda a: dist.all_to_all_single(output, source, group=group, async_op=a),
                            inputs=[(source, inp)], outputs=[(output, out)])
        if op == "all_to_allv":
            sends, receives = list(lay.send_splits(rank)), list(lay.recv_splits(rank))
            source, output = new(sum(sends)), new(sum(receives))
            return Prepared(lambda a: dist.all_to_all_single(output, source, output_split_sizes=receives,
                                                             input_split_sizes=sends, group=group, async_op=a),
                            inputs=[(source, inp)], outputs=[(output, out)])
        raise KeyError(op)

    def wait(self, handles: list[Any]) -> None:
        for handle in handles:
            if handle is not None:
                handle.wait()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- data ------------------------------------------------------------------------------------
    def fill(self, view: torch.Tensor, values: Any) -> None:
        if values is None:
            view.fill_(SENTINEL)
            return
        for start, stop in chunks(view.numel()):
            index = torch.arange(start, stop, dtype=torch.int64, device=self.device)
            view[start:stop].copy_(values(index).to(view.dtype))

    def count_wrong(self, view: torch.Tensor, expected: Any) -> int:
        wrong = 0
        for start, stop in chunks(view.numel()):
            index = torch.arange(start, stop, dtype=torch.int64, device=self.device)
            wrong += int((view[start:stop] != expected(index).to(view.dtype)).sum().item())
        return wrong

    # ---- control channel (gloo, CPU) ---------------------------------------------------------------
    def control_barrier(self) -> None:
        dist.barrier(group=self.control)

    def gather_float(self, value: float) -> list[float]:
        parts = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        dist.all_gather(parts, torch.tensor([value], dtype=torch.float64), group=self.control)
        return [float(p.item()) for p in parts]

    def agree_max(self, value: int) -> int:
        return self._all_reduce_int(value, dist.ReduceOp.MAX)

    def agree_sum(self, value: int) -> int:
        return self._all_reduce_int(value, dist.ReduceOp.SUM)

    def _all_reduce_int(self, value: int, op: Any) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=op, group=self.control)
        return int(tensor.item())

    def is_oom(self, error: BaseException) -> bool:
        return is_out_of_memory(error)

    # ---- tallies -----------------------------------------------------------------------------------
    def tally_start(self, point: CommPoint) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._itemsize = DTYPES[point.dtype].itemsize
        self._profiler = profile(activities=activities, profile_memory=True, record_shapes=True)
        with _quiet_stderr():
            self._profiler.__enter__()

    def tally_stop(self) -> dict[str, Any]:
        from stepscope.distributed.collectives.tally import torch_raw_tally

        with _quiet_stderr():
            self._profiler.__exit__(None, None, None)
        raw = torch_raw_tally(self._profiler, self._itemsize, self.device.type)
        self._profiler = None
        return raw

    def environment(self) -> dict[str, Any]:
        from stepscope.measure.environment import torch_environment

        env = torch_environment(self.device, self.world_size)
        env["backend"] = self.backend
        env["ranks"] = _rank_places(self.control, self.world_size, str(self.device))
        return env


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while the profiler starts or stops: kineto prints a `profiler_start` /
    `profiler_stop` line per rank from C++ that no setting turns off. The measured calls run outside."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _rank_places(control: Any, world_size: int, device: str) -> list[dict[str, Any]]:
    """Host, pid and device of every rank (for the nccl-tests `# Rank` lines and multi-node records)."""
    import socket

    places: list[Any] = [None] * world_size
    dist.all_gather_object(places, {"host": socket.gethostname(), "pid": os.getpid(), "device": device},
                           group=control)
    return places


def comm_rank(ctx: RankContext, points: list[CommPoint], options: TorchRankOptions) -> RankOutcome:
    """The launcher's rank function for `stepscope comm` on torch backends."""
    group = None
    if options.group_backend is not None:
        from stepscope.distributed.collectives.backends import import_backend_module

        import_backend_module(options.group_backend)  # registers the backend with torch.distributed
        group = dist.new_group(backend=options.group_backend, timeout=dt.timedelta(seconds=options.timeout_s))
    comm = TorchCommunicator(ctx, group, label=options.label, timeout_s=options.timeout_s)
    return run_points(comm, points, out_dir=options.out_dir, tally=options.tally)
