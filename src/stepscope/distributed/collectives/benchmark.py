"""The jobs of a collective benchmark request (`CommConfig`): one per backend and world size.

Each job is one launch: torch backends through the launcher (one spawn that measures every point), mpi
through mpiexec (`mpi_job`). Inside a job, rank 0 appends each point's record as soon as it is measured,
so an interrupted sweep keeps its finished points and `--resume` skips them. Tallies (`tally=True`) come
back merged over ranks, one per point. `sweep_records` gives the stored records of a request's points,
earlier runs included, for a resumed sweep's fit and plot. `session` runs a whole request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepscope.distributed.collectives.config import TORCH_BACKENDS, CommConfig
from stepscope.distributed.collectives.points import CommPoint, Rounding, plan_points
from stepscope.results.store import RecordStore, point_key


@dataclass(frozen=True)
class Job:
    """One backend at one world size: the points to measure and what planning noticed."""

    backend: str
    """The backend measured."""
    world_size: int
    """Ranks of this job."""
    points: list[CommPoint]
    """Every point, in measurement order."""
    roundings: list[Rounding]
    """Sizes rounded down for this world size (reported before the job runs)."""
    skipped: list[str]
    """Sizes too small for one element per rank (not measured)."""


def plan_jobs(config: CommConfig) -> list[Job]:
    """Every (backend, world size) job of the request, in order (under torchrun/Slurm: its world size)."""
    from stepscope.distributed.launch.ranks import external_launch_env

    external = external_launch_env()
    worlds = (external["world_size"],) if external else config.worlds
    jobs = []
    for backend in config.backends:
        for world in worlds:
            points, roundings, skipped = plan_points(
                backend=backend, world_size=world, ops=config.ops, sizes=config.sizes, dtypes=config.dtypes,
                modes=config.modes, places=config.places, iters=config.iters, warmup=config.warmup, root=config.root,
                skews=config.skews, seed=config.seed)
            jobs.append(Job(backend, world, points, roundings, skipped))
    return jobs


@dataclass
class JobResult:
    """What one job measured: records in point order and, per record, the tally merged over ranks."""

    job: Job
    """The job this result belongs to."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """Records rank 0 appended, in point order."""
    tallies: list[dict[str, Any] | None] = field(default_factory=list)
    """Per record: the tally merged over ranks (None without --tally or for unmeasured points)."""
    skipped_done: int = 0
    """Points skipped because the store already had them (--resume)."""


def run_job(job: Job, config: CommConfig, store: RecordStore | None, *, resume: bool = False) -> JobResult | None:
    """Measure one job; None on a non-zero rank under torchrun (rank 0 reports)."""
    from stepscope.distributed.collectives.tally import merge

    done = store.done_keys() if (store is not None and resume) else set()
    points = [p for p in job.points if point_key("comm", p.config()) not in done]
    result = JobResult(job, skipped_done=len(job.points) - len(points))
    if not points:
        return result
    out_dir = str(store.path.parent) if store is not None else None
    if job.backend == "mpi":
        from stepscope.distributed.collectives.mpi_job import run_mpi

        outcome = run_mpi(points, world_size=job.world_size, out_dir=out_dir, tally=config.tally,
                          timeout_s=config.timeout_s)
        result.records = outcome.records
        result.tallies = [merge(t) if t else None for t in outcome.tallies]
        return result
    from stepscope.distributed.collectives.torch_rank import TorchRankOptions, comm_rank
    from stepscope.distributed.launch.launcher import LaunchConfig, launch

    launcher_backend, group_backend = TORCH_BACKENDS[job.backend]
    options = TorchRankOptions(out_dir=out_dir, tally=config.tally, group_backend=group_backend, label=job.backend,
                               timeout_s=config.timeout_s)
    outcomes = launch(comm_rank, points, options,
                      config=LaunchConfig(world_size=job.world_size, backend=launcher_backend, threads=config.threads,
                                          timeout_s=config.timeout_s, oversubscribe=config.oversubscribe))
    if outcomes is None:
        return None
    result.records = outcomes[0].records
    result.tallies = [merge([o.tallies[i] for o in outcomes]) if config.tally and outcomes[0].tallies[i] else None
                      for i in range(len(points))]
    return result


def sweep_records(config: CommConfig, store: RecordStore) -> list[dict[str, Any]]:
    """The store's latest record of every point `config` plans, in plan order: this run's points and those
    of earlier runs of the same request (same backend, op, world, size, dtype, mode, placement, iters,
    warmup). What a resumed sweep fits and plots."""
    latest: dict[str, dict[str, Any]] = {}
    for record in store.records():
        if record.get("kind") == "comm" and record.get("status") != "error" and "key" in record:
            latest[record["key"]] = record
    found = (latest.get(point_key("comm", point.config())) for job in plan_jobs(config) for point in job.points)
    return [record for record in found if record is not None]
