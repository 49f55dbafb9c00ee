"""`stepscope innet bench`: in-network all-reduce through a real switch process vs gloo all-reduce, side by
side in one run: latency and algbw per size, per-op (each op waited) and batch (ops issued together).

Every rank runs both implementations alternately through the interleaved harness
(`measure.timer.interleaved_rounds`: innet gloo, gloo innet, ...), each op after a barrier, so drift and
noise hit both alike. The latency of an iteration is the slowest rank's time (the op is done when
every rank has the result). algbw = size x 8 / latency (Gb/s); in batch mode size x ops / time.
The first result of every cell is checked against a local reference before anything is timed; `check`
verifies every result. Rank 0 appends one record per cell as soon as it is measured (Ctrl-C keeps them).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from stepscope.distributed.collectives.points import CALL_MODES
from stepscope.distributed.tracing.windows import window_marker
from stepscope.errors import UsageError
from stepscope.innet.runs.reference import CheckResult, check_result, reference_input
from stepscope.innet.runs.runner import RunOutcome, check_job, record_settings, run_ranks, start_run
from stepscope.innet.switch.process import probe
from stepscope.innet.wire import fastpath
from stepscope.innet.worker.client import InnetJob
from stepscope.innet.worker.config import JobConfig, shared_job_id
from stepscope.results.store import RecordStore, make_record

COUNTER_COLUMNS = ("ok", "to", "kr", "re", "dup", "old", "bad")


@dataclass(frozen=True)
class BenchConfig:
    """One `innet bench` run."""

    world: int = 2
    """Ranks (worker processes)."""
    sizes_bytes: tuple[int, ...] = (4096, 65536, 1 << 20)
    """All-reduce sizes in bytes (4 bytes per element)."""
    modes: tuple[str, ...] = CALL_MODES
    """per-op: each op waited before the next; batch: `batch` ops issued together."""
    batch: int = 8
    """Ops issued together in batch mode."""
    warmup: int = 2
    """Untimed iterations per cell."""
    iters: int = 10
    """Timed iterations per cell."""
    dtype: str = "fp32"
    """fp32 (quantized, averaged or summed) or int32 (exact sums; averages truncated toward zero)."""
    op: str = "avg"
    """avg or sum."""
    k: int | None = None
    """Fastest-K (None = world: no straggler tolerance)."""
    preemptive: bool = False
    """Complete blocks as soon as K contributions arrived."""
    gloo: bool = True
    """Also time gloo's all-reduce at the same world size."""
    switch_shards: int = 1
    """Processes of the switch started for the run (slot j on shard j mod shards); ignored with `switch`."""
    check: bool = False
    """Check every result against the local reference (else only the first of each cell)."""
    syscalls: bool = False
    """Run the benchmark again under strace and tally what innet and gloo do beneath their APIs."""
    seed: int = 0
    """Seed of the inputs and of the straggler decisions."""
    job: JobConfig = field(default_factory=JobConfig)
    """Packet and timer settings and faults; the switch (`run_bench`'s), rank, world and job id are set per run."""

    def validate(self) -> None:
        if self.world < 1:
            raise UsageError("--world must be at least 1")
        if any(size < 4 or size % 4 for size in self.sizes_bytes):
            raise UsageError("--sizes must be multiples of 4 bytes (float32/int32 elements)")
        if any(mode not in CALL_MODES for mode in self.modes):
            raise UsageError(f"--call-mode must be {' or '.join(CALL_MODES)}")
        if self.dtype not in ("fp32", "int32") or self.op not in ("avg", "sum"):
            raise UsageError("--dtype fp32|int32 and --op avg|sum")
        if self.k is not None and not 1 <= self.k <= self.world:
            raise UsageError(f"-k must be 1..world ({self.world})")
        if self.batch < 1 or self.iters < 1 or self.warmup < 0:
            raise UsageError("--batch and --iters must be >= 1, --warmup >= 0")
        if not 1 <= self.switch_shards <= 64:
            raise UsageError("--switch-shards must be 1..64")
        if self.syscalls:
            from stepscope.distributed.launch.ranks import external_launch_env

            if external_launch_env() is not None:
                raise UsageError("--tally syscalls traces the ranks stepscope starts itself; run it without "
                                 "torchrun/srun")
        check_job(self.job, self.world)

    def to_dict(self) -> dict[str, Any]:
        return record_settings(self)


def bench_rank(ctx: Any, config: BenchConfig, out: str | os.PathLike | None) -> list[dict[str, Any]]:
    """One rank of the benchmark (runs under the launcher); rank 0 appends each cell's record to
    `<out>/innet-bench.jsonl` as soon as it is measured and returns the rows."""
    import torch.distributed as dist

    from stepscope.measure.environment import torch_environment

    # the job id is drawn on rank 0 and shared: under torchrun every rank runs `run_bench` itself
    job = InnetJob(replace(config.job, rank=ctx.rank, world=ctx.world_size, job_id=shared_job_id()),
                   log=lambda _: None)
    job.join()
    straggler = config.job.faults.straggler
    rng = random.Random(config.seed * 7919 + ctx.rank)
    store = RecordStore(out, "innet-bench") if out is not None and ctx.rank == 0 else None
    env = torch_environment("cpu", ctx.world_size) if ctx.rank == 0 else {}
    rounds = config.warmup + config.iters
    # which data path the ranks and the switch run (`wire.fastpath`): in every row, so in every record
    paths = {"data_path": fastpath.name(fastpath.resolve()),
             "switch_data_path": ("c" if probe(config.job.switch)["fast_path"] else "numpy") if ctx.rank == 0 else ""}
    rows = []
    step = 0
    try:
        for size in config.sizes_bytes:
            inputs = [reference_input(config.seed, r, size // 4, config.dtype) for r in range(ctx.world_size)]
            for mode in config.modes:
                # one straggle decision per round, drawn in round order; the steps go on across cells
                delays = [straggler.delay_for(ctx.rank, step + i, rng) if straggler else 0.0 for i in range(rounds)]
                step += rounds
                stats_before = job.stats() if ctx.rank == 0 else {}
                worker_before = job.counters
                samples, check = _time_cell(job, config, mode, inputs, ctx.rank, delays)
                stats_after = job.stats() if ctx.rank == 0 else {}
                worker = {name: value - worker_before.get(name, 0) for name, value in job.counters.items()}
                gathered: list[Any] = [None] * ctx.world_size
                dist.all_gather_object(gathered, (samples["innet"], samples.get("gloo", []), asdict(check), worker))
                if ctx.rank == 0:
                    ops = config.batch if mode == "batch" else 1
                    row = {**_row(config, size, mode, ops, gathered, stats_before, stats_after), **paths}
                    rows.append(row)
                    if store is not None:
                        store.append(make_record("innet-bench", {**config.to_dict(), "size_bytes": size,
                                                                 "mode": mode},
                                                 {k: v for k, v in row.items() if k not in ("size_bytes", "mode")},
                                                 env=env))
    finally:
        job.close()
    return rows


def _time_cell(job: InnetJob, config: BenchConfig, mode: str, inputs: list[np.ndarray], rank: int,
               delays: list[float]) -> tuple[dict[str, list[float]], CheckResult]:
    """One cell's rounds through the interleaved harness (innet gloo, gloo innet, ...), each op after a
    barrier; the first innet result is checked (every one with `check`). Seconds per round and label."""
    import torch
    import torch.distributed as dist

    from stepscope.measure.timer import interleaved_rounds

    mine = inputs[rank]
    ops = config.batch if mode == "batch" else 1
    buffers = [np.empty_like(mine) for _ in range(ops)]
    tensors = [torch.from_numpy(np.empty_like(mine)) for _ in range(ops)]
    check = CheckResult()

    def run(impl: str, round_index: int) -> float:
        # timed rounds are marked for a tracer (`--tally syscalls`); a no-op otherwise
        mark = window_marker(rank, f"{impl}:{mine.nbytes}:{mode}") if round_index >= config.warmup else _no_mark
        dist.barrier()
        mark("begin")
        if impl == "gloo":
            seconds = _time_gloo(tensors, mine, config, delays[round_index], len(inputs))
            mark("end")
            return seconds
        seconds, pendings = _time_innet(job, buffers, mine, config, delays[round_index])
        mark("end")
        if round_index == 0 or config.check:
            for pending, buffer in zip(pendings, buffers, strict=True):
                check.add(check_result(buffer, inputs, values_per_packet=job.config.k, average=config.op == "avg",
                                       contributors=pending.op.contributors))
        return seconds

    labels = ["innet", "gloo"] if config.gloo else ["innet"]
    return interleaved_rounds(labels, run, warmup=config.warmup, iters=config.iters), check


def _no_mark(edge: str) -> None:
    """Warm-up rounds are not tallied."""


def _time_innet(job: InnetJob, buffers: list[np.ndarray], source: np.ndarray, config: BenchConfig,
                delay: float) -> tuple[float, list[Any]]:
    for buffer in buffers:
        buffer[:] = source
    start = time.perf_counter()
    if delay:
        time.sleep(delay)  # this rank straggles: its op starts late
    pendings = [job.submit(buffer, config.op, config.k, config.preemptive) for buffer in buffers]
    for pending in pendings:
        pending.wait()
    return time.perf_counter() - start, pendings


def _time_gloo(tensors: list[Any], source: np.ndarray, config: BenchConfig, delay: float, world: int) -> float:
    import torch.distributed as dist

    for tensor in tensors:
        tensor.numpy()[:] = source
    start = time.perf_counter()
    if delay:
        time.sleep(delay)
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    for work in works:
        work.wait()
    if config.op == "avg":  # the same arithmetic as the switch's average: integers divide toward zero
        for tensor in tensors:
            tensor.div_(world, rounding_mode="trunc" if not tensor.is_floating_point() else None)
    return time.perf_counter() - start


def _row(config: BenchConfig, size: int, mode: str, ops: int, gathered: list[Any], before: dict[str, int],
         after: dict[str, int]) -> dict[str, Any]:
    """One table row / record metrics from every rank's timings (slowest rank per iteration)."""
    row: dict[str, Any] = {"size_bytes": size, "mode": mode}
    for index, impl in enumerate(("innet", "gloo")):
        per_rank = [np.asarray(g[index]) for g in gathered]
        if not len(per_rank[0]):
            continue
        slowest = np.max(np.stack(per_rank), axis=0)
        median = float(np.median(slowest))
        row[f"{impl}_latency_ms_median"] = median * 1e3 / ops
        row[f"{impl}_latency_ms_p90"] = float(np.percentile(slowest, 90)) * 1e3 / ops
        row[f"{impl}_algbw_GBps"] = size * ops / median / 1e9
    if "gloo_algbw_GBps" in row:
        row["innet_vs_gloo_speedup"] = row["innet_algbw_GBps"] / row["gloo_algbw_GBps"]
    for name in COUNTER_COLUMNS:
        row[name] = after.get(name, 0) - before.get(name, 0)
    checks = CheckResult()
    for g in gathered:
        checks.add(CheckResult(**g[2]))
    row["checked_elements"], row["wrong_elements"] = checks.checked, checks.wrong
    row["unchecked_elements"] = checks.unchecked
    row["worker_retransmissions"] = sum(g[3].get("retransmitted", 0) for g in gathered)  # this cell's, all ranks
    # blocks a late rank sent clipped to an exponent agreed without it (fastest-K): their results are not exact
    row["clipped_blocks"] = sum(g[3].get("clipped_blocks", 0) for g in gathered)
    return row


@dataclass
class BenchOutcome(RunOutcome[BenchConfig]):
    """`run_bench`'s outcome: the config as run and a row per cell."""

    syscalls: list[dict[str, Any]] = field(default_factory=list)
    """`syscalls` records of the traced run (with `syscalls`; see `innet.runs.syscall_tally`)."""

    @property
    def data_paths(self) -> str:
        """Which data path the ranks and the switch ran (`wire.fastpath`), in words."""
        ranks, switch = (self.rows[0]["data_path"], self.rows[0]["switch_data_path"]) if self.rows else ("?", "?")
        return f"data path {ranks} (switch: {switch})"

    @property
    def wrong_elements(self) -> int:
        """Elements of in-network results that differed from the reference (a failed benchmark if any)."""
        return sum(row.get("wrong_elements", 0) for row in self.rows)


def run_bench(config: BenchConfig, out: str | os.PathLike | None = None, *,
              switch: str | None = None) -> BenchOutcome | None:
    """Run the benchmark on `config.world` launched ranks (under torchrun/Slurm: theirs) against the running
    switch at `switch` (None: a switch process started for the run; required under torchrun/Slurm), one
    `innet-bench` record per cell in `<out>/innet-bench.jsonl` (None: none). Rank 0's outcome; None on the
    other ranks under torchrun/Slurm."""
    strace = None
    if config.syscalls:  # no tracer here: one line before anything starts or is written
        from stepscope.distributed.tracing.strace import find_strace

        strace = find_strace()
    config, store = start_run(config, out, switch, "innet-bench")
    results = run_ranks(bench_rank, config, out, out=out, switch=switch, timeout_s=120, shards=config.switch_shards)
    if results is None:
        return None
    outcome = BenchOutcome(config, results[0], None if store is None else store.path)
    if strace is not None:
        from stepscope.innet.runs.syscall_tally import trace_bench

        outcome.syscalls = trace_bench(config, outcome.rows, strace=strace)
        for record in outcome.syscalls if store is not None else []:
            store.append(record)
    return outcome
