"""What every rank does for each sweep point, whatever the backend: allocate, check correctness once,
warm up, time with nccl-tests hygiene, agree on the result across ranks; rank 0 writes the record.

Timing (per point, on every rank):
1. allocation (every rank must succeed; an OOM anywhere makes an `oom` row everywhere),
2. one call on patterned data, device synchronized, wrong elements counted and summed over ranks,
3. `warmup` untimed calls (lazy communicator setup, first-touch pages, caches),
4. a barrier on the control channel aligns the start, the host clock starts,
5. `iters` calls: per-op waits each call and synchronizes the device; batch issues all, then waits,
6. device synchronized, clock stopped; per-rank time per call = elapsed / iters,
7. max, min and mean over ranks (the max bounds the collective; algbw/busbw use it).

The backend specifics live behind `Communicator` (torch: `torch_collectives`, mpi4py: `mpi_rank`). All
agreement and timing exchange uses a separate control channel, never the group being measured.

Testing aid: with `STEPSCOPE_COMM_FAIL_RANK=R` in the environment, rank R raises at the first point
(`R:hang`: it stops responding instead), so the failure paths (every rank torn down, the parent reports
rank R's message, or a hang is cut off by the timeout) can be exercised for real.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepscope.distributed.collectives.ops import DTYPES, UNEVEN_OPS, Layout, bandwidths_GBps
from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.collectives.splits import imbalance
from stepscope.distributed.tracing.windows import window_marker
from stepscope.results.store import RecordStore, make_record

FAIL_RANK_ENV = "STEPSCOPE_COMM_FAIL_RANK"
FILL_CHUNK = 1 << 22
"""Elements filled or verified per step, so checking a 1 GB buffer never needs another 1 GB."""

IndexFn = Callable[[Any], Any]
"""Integer index array -> integer values (see collectives.input_values / expected_values)."""


@dataclass
class Prepared:
    """Buffers of one point on one rank and how to start the call on them."""

    start: Callable[[bool], Any]
    """start(async_op) -> a handle to wait on (or None when the call already completed)."""
    inputs: list[tuple[Any, IndexFn]] = field(default_factory=list)
    """(buffer view, its input values) filled before the check."""
    outputs: list[tuple[Any, IndexFn]] = field(default_factory=list)
    """(buffer view, its expected values) set to SENTINEL before the check, then verified."""


class Communicator(Protocol):
    """One backend on one rank: buffers and calls for the measured group, plus a control channel."""

    backend: str
    rank: int
    world_size: int

    def unsupported(self, point: CommPoint) -> str | None:
        """Why this backend lacks the point's operation (placement, dtype), or None."""

    def prepare(self, point: CommPoint) -> Prepared: ...

    def wait(self, handles: list[Any]) -> None: ...

    def sync(self) -> None:
        """Wait for the device (work.wait() only orders the current CUDA stream)."""

    def fill(self, view: Any, values: IndexFn | None) -> None:
        """Write values(index) into `view` (SENTINEL everywhere when `values` is None)."""

    def count_wrong(self, view: Any, expected: IndexFn) -> int: ...

    def control_barrier(self) -> None: ...

    def gather_float(self, value: float) -> list[float]:
        """Every rank's value, in rank order, on every rank."""

    def agree_max(self, value: int) -> int: ...

    def agree_sum(self, value: int) -> int: ...

    def is_oom(self, error: BaseException) -> bool: ...

    def tally_start(self, point: CommPoint) -> None: ...

    def tally_stop(self) -> dict[str, Any]:
        """This rank's raw tally of the profiled calls (see `tally.py`)."""

    def environment(self) -> dict[str, Any]:
        """The record environment; called on every rank at the same time (it may communicate)."""


@dataclass
class RankOutcome:
    """What one rank hands back: records (rank 0 only) and per-point raw tallies (every rank)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tallies: list[dict[str, Any] | None] = field(default_factory=list)


_OK, _UNSUPPORTED, _OOM = 0, 1, 2


def run_points(comm: Communicator, points: list[CommPoint], *, out_dir: str | None = None, tally: bool = False,
               on_record: Callable[[dict[str, Any], dict[str, Any] | None], None] | None = None) -> RankOutcome:
    """Measure every point in order on this rank (all ranks call this with the same points); rank 0
    appends each record to `<out_dir>/comm.jsonl` as soon as the point is done."""
    _maybe_fail(comm.rank)
    store = RecordStore(out_dir, "comm") if (comm.rank == 0 and out_dir is not None) else None
    env = comm.environment()  # every rank: it may gather where the ranks run (a collective)
    if comm.rank != 0:
        env = {}
    outcome = RankOutcome()
    for point in points:
        record, raw_tally = measure_point(comm, point, env, tally=tally)
        outcome.tallies.append(raw_tally)
        if comm.rank == 0:
            if store is not None:
                store.append(record)  # each finished point is on disk before the next starts (Ctrl-C keeps it)
            outcome.records.append(record)
        if on_record is not None:
            on_record(record, raw_tally)
    return outcome


def measure_point(comm: Communicator, point: CommPoint, env: dict[str, Any], *,
                  tally: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One point on this rank: (the record, meaningful on rank 0; this rank's raw tally or None)."""
    config = point.config()
    reason = comm.unsupported(point)
    if reason is not None:  # known from the op table alone: every rank reaches the same answer
        return make_record("comm", config, {}, status="unsupported", env=env, note=reason), None

    state, note, prepared = _agreed_prepare(comm, point)
    if state == _OK:
        state, note, wrong = _agreed_check(comm, point, prepared)
    if state == _OOM:
        return make_record("comm", config, {}, status="oom", env=env, note=note), None
    if state == _UNSUPPORTED:
        return make_record("comm", config, {}, status="unsupported", env=env, note=note), None

    run = _runner(comm, point, prepared)
    run(point.warmup)
    comm.sync()
    mark = window_marker(comm.rank, mark_key(point))  # a no-op unless a tracer watches (`--tally syscalls`)
    comm.control_barrier()
    mark("begin")
    start = time.perf_counter()
    run(point.iters)
    comm.sync()
    per_call_s = (time.perf_counter() - start) / point.iters
    mark("end")
    times_s = comm.gather_float(per_call_s)

    raw_tally = None
    if tally:  # a separate profiled pass, so profiling overhead never leaks into the timing above
        comm.control_barrier()
        comm.tally_start(point)
        run(point.iters)
        comm.sync()
        raw_tally = comm.tally_stop()

    metrics = timing_metrics(point, times_s, wrong)
    status = "mismatch" if wrong else "ok"
    note = f"{wrong} wrong element(s) summed over ranks" if wrong else None
    return make_record("comm", config, metrics, status=status, env=env, note=note), raw_tally


def mark_key(point: CommPoint) -> str:
    """The name of a point's timed window in a trace (unique within one job)."""
    place = "none" if point.in_place is None else ("in" if point.in_place else "out")
    skew = f":skew{point.skew:g}" if point.op in UNEVEN_OPS else ""  # all_to_allv has a point per skew
    return f"{point.op}:{point.layout().size_bytes}:{place}:{point.mode}:{point.dtype}{skew}"


def timing_metrics(point: CommPoint, times_s: list[float], wrong: int) -> dict[str, Any]:
    """Per-rank seconds per call -> record metrics: time over ranks, algbw/busbw from the max, #wrong
    (all_to_allv adds its imbalance and the hottest receiver's rate, see `uneven_metrics`)."""
    slowest = max(times_s)
    lay = point.layout()
    algbw, busbw = bandwidths_GBps(point.op, lay.size_bytes, slowest, point.world_size)
    metrics = {"time_us_max": slowest * 1e6, "time_us_min": min(times_s) * 1e6,
               "time_us_mean": sum(times_s) / len(times_s) * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw,
               "wrong": wrong}
    if lay.splits is not None:
        metrics.update(uneven_metrics(lay, slowest))
    return metrics


def uneven_metrics(lay: Layout, time_s: float) -> dict[str, Any]:
    """all_to_allv beside nccl-tests' columns: `imbalance` (most elements a rank receives / the mean),
    `recv_bytes_max` (that rank's output) and `recv_max_GBps`: the bytes it receives from the other ranks
    per second. busbw charges every rank the mean; the hottest receiver is what bounds the call, so its
    rate is the one to hold against a link's."""
    assert lay.splits is not None
    itemsize = DTYPES[lay.dtype].itemsize
    hot = max(range(lay.world_size), key=lay.recv_count_of)
    from_others = lay.recv_count_of(hot) - lay.splits[hot][hot]
    return {"imbalance": imbalance(lay.splits), "recv_bytes_max": lay.recv_count_of(hot) * itemsize,
            "recv_max_GBps": from_others * itemsize / 1e9 / time_s if time_s > 0 else None}


def _runner(comm: Communicator, point: CommPoint, prepared: Prepared) -> Callable[[int], None]:
    if point.mode == "batch":
        def run(calls: int) -> None:
            comm.wait([prepared.start(True) for _ in range(calls)])
    else:
        def run(calls: int) -> None:
            for _ in range(calls):
                comm.wait([prepared.start(False)])
                comm.sync()
    return run


def _agreed_prepare(comm: Communicator, point: CommPoint) -> tuple[int, str | None, Prepared | None]:
    """Allocate on every rank; a failure anywhere (OOM) is agreed on before any rank communicates."""
    state, note, prepared = _OK, None, None
    try:
        prepared = comm.prepare(point)
    except Exception as error:  # noqa: BLE001 - only OOM is a row; anything else is re-raised below
        if not comm.is_oom(error):
            raise
        state, note = _OOM, _first_line(error)
    agreed = comm.agree_max(state)
    if agreed != _OK:
        return agreed, note or "out of memory on another rank", None
    return _OK, None, prepared


def _agreed_check(comm: Communicator, point: CommPoint, prepared: Prepared) -> tuple[int, str | None, int]:
    """Fill patterned inputs, run once, count wrong elements; an op the backend rejects is `unsupported`."""
    state, note = _OK, None
    for view, _ in prepared.outputs:
        comm.fill(view, None)
    for view, values in prepared.inputs:
        comm.fill(view, values)
    try:
        comm.wait([prepared.start(False)])
        comm.sync()
    except Exception as error:  # noqa: BLE001 - backends reject unsupported dtypes/ops with assorted types
        state, note = (_OOM if comm.is_oom(error) else _UNSUPPORTED), _first_line(error)
    agreed = comm.agree_max(state)
    if agreed != _OK:
        return agreed, note or "failed on another rank", 0
    local = sum(comm.count_wrong(view, expected) for view, expected in prepared.outputs)
    return _OK, None, comm.agree_sum(local)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _maybe_fail(rank: int) -> None:
    target, _, how = os.environ.get(FAIL_RANK_ENV, "").partition(":")
    if target != str(rank):
        return
    if how == "hang":  # a rank that never reaches the next collective: the others must not wait forever
        while True:
            time.sleep(1.0)
    raise RuntimeError(f"injected failure on rank {rank} ({FAIL_RANK_ENV}={rank})")


def chunks(total: int, step: int = FILL_CHUNK) -> list[tuple[int, int]]:
    """[start, stop) ranges covering `total` elements in steps of `step`."""
    return [(start, min(total, start + step)) for start in range(0, total, step)]

