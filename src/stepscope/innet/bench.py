"""`stepscope innet bench`: in-network all-reduce through a real switch process vs gloo all-reduce, side by
side in one run: latency and algbw per size, per-op (each op waited) and batch (ops issued together).

Every rank runs both implementations alternately (innet, gloo, gloo, innet, ...) after a barrier, so drift
and noise hit both alike. The latency of an iteration is the slowest rank's time (the op is done when
every rank has the result). algbw = size x 8 / latency (Gb/s); in batch mode size x ops / time.
The first result of every cell is checked against a local reference before anything is timed; `check`
verifies every result. Rank 0 appends one record per cell as soon as it is measured (Ctrl-C keeps them).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.innet.reference import CheckResult, check_result, reference_input
from stepscope.innet.worker import InnetJob, JobConfig, shared_job_id

MODES = ("per-op", "batch")
COUNTER_COLUMNS = ("ok", "to", "kr", "re", "dup", "old", "bad")


@dataclass(frozen=True)
class BenchConfig:
    """One `innet bench` run."""

    world: int = 2
    """Ranks (worker processes)."""
    sizes_bytes: tuple[int, ...] = (4096, 65536, 1 << 20)
    """All-reduce sizes in bytes (4 bytes per element)."""
    modes: tuple[str, ...] = MODES
    """per-op: each op waited before the next; batch: `batch` ops issued together."""
    batch: int = 8
    """Ops issued together in batch mode."""
    warmup: int = 2
    """Untimed iterations per cell."""
    iters: int = 10
    """Timed iterations per cell."""
    dtype: str = "f32"
    """f32 (quantized, averaged or summed) or i32 (exact sums; averages truncated toward zero)."""
    op: str = "avg"
    """avg or sum."""
    k: int | None = None
    """Fastest-K (None = world: no straggler tolerance)."""
    preemptive: bool = False
    """Complete blocks as soon as K contributions arrived."""
    gloo: bool = True
    """Also time gloo's all-reduce at the same world size."""
    check: bool = False
    """Check every result against the local reference (else only the first of each cell)."""
    seed: int = 0
    """Seed of the inputs and of the straggler decisions."""
    job: JobConfig = field(default_factory=JobConfig)
    """Switch address, packet and timer settings and faults; rank, world and job id are set per run."""

    def validate(self) -> None:
        if self.world < 1:
            raise UsageError("--world must be at least 1")
        if any(size < 4 or size % 4 for size in self.sizes_bytes):
            raise UsageError("--sizes must be multiples of 4 bytes (float32/int32 elements)")
        if any(mode not in MODES for mode in self.modes):
            raise UsageError(f"--mode must be {' or '.join(MODES)}")
        if self.dtype not in ("f32", "i32") or self.op not in ("avg", "sum"):
            raise UsageError("--dtype f32|i32 and --op avg|sum")
        if self.k is not None and not 1 <= self.k <= self.world:
            raise UsageError(f"-k must be 1..world ({self.world})")
        if self.batch < 1 or self.iters < 1 or self.warmup < 0:
            raise UsageError("--batch and --iters must be >= 1, --warmup >= 0")
        replace(self.job, rank=0, world=self.world).validate()
        if self.job.faults.straggler is not None:
            self.job.faults.straggler.validate(self.world)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["job"] = self.job.shared_settings()
        return out


def bench_rank(ctx: Any, config: BenchConfig, store_dir: str | None) -> list[dict[str, Any]]:
    """One rank of the benchmark (runs under the launcher); rank 0 returns the rows."""
    import torch
    import torch.distributed as dist

    from stepscope.measure.environment import torch_environment
    from stepscope.results.store import RecordStore, make_record

    # the job id is drawn on rank 0 and shared: under torchrun every rank runs `run_bench` itself
    job = InnetJob(replace(config.job, rank=ctx.rank, world=ctx.world_size, job_id=shared_job_id()),
                   log=lambda _: None)
    job.join()
    straggler = config.job.faults.straggler
    rng = random.Random(config.seed * 7919 + ctx.rank)
    store = RecordStore(store_dir, "innet-bench") if store_dir and ctx.rank == 0 else None
    env = torch_environment("cpu", ctx.world_size) if ctx.rank == 0 else {}
    rows = []
    step = 0
    try:
        for size in config.sizes_bytes:
            numel = size // 4
            inputs = [reference_input(config.seed, r, numel, config.dtype) for r in range(ctx.world_size)]
            mine = inputs[ctx.rank]
            for mode in config.modes:
                ops = config.batch if mode == "batch" else 1
                buffers = [np.empty_like(mine) for _ in range(ops)]
                tensors = [torch.from_numpy(np.empty_like(mine)) for _ in range(ops)]
                check = CheckResult()
                stats_before = job.stats() if ctx.rank == 0 else {}
                worker_before = job.counters
                innet_times, gloo_times = [], []
                for it in range(config.warmup + config.iters):
                    delay = straggler.delay_for(ctx.rank, step, rng) if straggler else 0.0
                    step += 1
                    order = ("innet", "gloo") if it % 2 == 0 else ("gloo", "innet")
                    for impl in order:
                        if impl == "gloo" and not config.gloo:
                            continue
                        dist.barrier()
                        if impl == "innet":
                            seconds, pendings = _time_innet(job, buffers, mine, config, delay)
                            if it == 0 or config.check:
                                for pending, buffer in zip(pendings, buffers):
                                    check.add(check_result(buffer, inputs, values_per_packet=job.config.k,
                                                           average=config.op == "avg",
                                                           contributors=pending.op.contributors))
                            if it >= config.warmup:
                                innet_times.append(seconds)
                        else:
                            seconds = _time_gloo(tensors, mine, config, delay, ctx.world_size)
                            if it >= config.warmup:
                                gloo_times.append(seconds)
                stats_after = job.stats() if ctx.rank == 0 else {}
                worker = {name: value - worker_before.get(name, 0) for name, value in job.counters.items()}
                gathered: list[Any] = [None] * ctx.world_size
                dist.all_gather_object(gathered, (innet_times, gloo_times, asdict(check), worker))
                if ctx.rank == 0:
                    row = _row(config, size, mode, ops, gathered, stats_before, stats_after)
                    rows.append(row)
                    if store is not None:
                        store.append(make_record("innet-bench", {**config.to_dict(), "size_bytes": size,
                                                                 "mode": mode},
                                                 {k: v for k, v in row.items() if k not in ("size_bytes", "mode")},
                                                 env=env))
    finally:
        job.close()
    return rows


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
        row[f"{impl}_algbw_Gbps"] = size * 8 * ops / median / 1e9
    if "gloo_algbw_Gbps" in row:
        row["innet_vs_gloo_speedup"] = row["innet_algbw_Gbps"] / row["gloo_algbw_Gbps"]
    for name in COUNTER_COLUMNS:
        row[name] = after.get(name, 0) - before.get(name, 0)
    checks = CheckResult()
    for g in gathered:
        checks.add(CheckResult(**g[2]))
    row["checked_elements"], row["wrong_elements"] = checks.checked, checks.wrong
    row["unchecked_elements"] = checks.unchecked
    row["worker_retransmissions"] = sum(g[3].get("retransmitted", 0) for g in gathered)  # this cell's, all ranks
    return row


def run_bench(config: BenchConfig, store_dir: str | None = None,
              spawn_switch: bool = True) -> list[dict[str, Any]] | None:
    """Run the benchmark on `config.world` launched ranks against a switch process started for the run
    (or, with `spawn_switch=False`, the running switch at `config.job.switch`); rank 0's rows (None on the
    other ranks under torchrun/Slurm)."""
    from stepscope.distributed.launch.launcher import LaunchConfig, launch
    from stepscope.innet.switch_process import switch_for

    config.validate()
    with switch_for(None if spawn_switch else config.job.switch, store_dir) as address:
        run = replace(config, job=replace(config.job, switch=address))
        results = launch(bench_rank, run, store_dir,
                         config=LaunchConfig(world_size=config.world, threads=1, timeout_s=120))
    return None if results is None else results[0]
