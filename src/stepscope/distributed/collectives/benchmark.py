"""The collective communication benchmark: a request (`CommConfig`) run per backend and world size.

    outcome = run_comm(CommConfig(backends=("gloo",), worlds=(2, 4), sizes=(1 << 20, 10 << 20)), store)

Each (backend, world size) is one job: torch backends through the launcher (one spawn that measures
every point), mpi through mpiexec (`mpi_bench`). Inside a job, rank 0 appends each point's record as
soon as it is measured, so an interrupted sweep keeps its finished points and `--resume` skips them.
Records: kind `comm`; measured points have config `"record": "point"`, α–β fits `"record": "fit"`
(see `alpha_beta`). Tallies (`tally=True`) come back merged over ranks, one per point.
`resolve_auto` turns backend `auto` into nccl or gloo (the launcher's rule); `sweep_records` gives the
stored records of a request's points, earlier runs included, for a resumed sweep's fit and plot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.distributed.collectives.backends import check_backend
from stepscope.distributed.collectives.ops import DTYPES, OPS, ROOTED_OPS
from stepscope.distributed.collectives.points import MODES, PLACES, CommPoint, Rounding, plan_points
from stepscope.errors import UsageError
from stepscope.results.store import RecordStore, point_key

TORCH_BACKENDS = {"gloo": ("gloo", None), "nccl": ("nccl", None), "oneccl": ("gloo", "ccl")}
"""stepscope backend -> (launcher backend, extra torch group backend measured instead of the default)."""


@dataclass(frozen=True)
class CommConfig:
    """A collective benchmark request."""

    backends: tuple[str, ...] = ("gloo",)
    """gloo, nccl, mpi, oneccl (horovod only reports how to get it)."""
    worlds: tuple[int, ...] = (2,)
    """World sizes; one job each."""
    ops: tuple[str, ...] = ("all_reduce",)
    """Collectives (see collectives.OPS)."""
    sizes: tuple[int, ...] = (1 << 10, 1 << 20)
    """Requested sizes in bytes (S after nccl-tests rounding)."""
    dtypes: tuple[str, ...] = ("fp32",)
    """Element types."""
    modes: tuple[str, ...] = ("per-op",)
    """per-op and/or batch."""
    places: tuple[str, ...] = ("out", "in")
    """out-of-place and/or in-place."""
    iters: int = 20
    """Timed calls per point (nccl-tests -n)."""
    warmup: int = 5
    """Untimed calls per point before timing (nccl-tests -w)."""
    root: int = 0
    """Root of broadcast and reduce."""
    threads: int | None = None
    """CPU threads per rank (None: cores / local ranks)."""
    timeout_s: float = 300.0
    """A rank blocked this long on a peer (torch) or a job silent this long (mpi) is stopped."""
    tally: bool = False
    """Also profile each point for the per-backend tables."""
    oversubscribe: bool = False
    """Allow more locally started ranks than launch_env.MAX_RANKS_PER_CORE per core."""

    def validate(self) -> None:
        """Raise UsageError for anything that cannot run here, before any work starts."""
        for name, values in (("--backend", self.backends), ("--world", self.worlds), ("--op", self.ops),
                             ("--sizes", self.sizes), ("--dtype", self.dtypes), ("--mode", self.modes),
                             ("--place", self.places)):
            if not values:
                raise UsageError(f"{name} needs at least one value")
        _check_choices("--op", self.ops, OPS)
        _check_choices("--dtype", self.dtypes, tuple(DTYPES))
        _check_choices("--mode", self.modes, MODES)
        _check_choices("--place", self.places, PLACES)
        if min(self.worlds) < 1:
            raise UsageError(f"world sizes must be at least 1, got {min(self.worlds)}")
        if self.iters < 1 or self.warmup < 0:
            raise UsageError("--iters must be positive and --warmup non-negative")
        if self.timeout_s <= 0:
            raise UsageError("--timeout must be positive")
        if any(op in ROOTED_OPS for op in self.ops) and not 0 <= self.root < min(self.worlds):
            raise UsageError(f"--root {self.root} is not a rank of the smallest world ({min(self.worlds)} ranks)")
        from stepscope.distributed.launch.ranks import check_local_world, external_launch_env

        if external_launch_env() is None:  # stepscope starts the ranks itself (spawn or mpiexec): bounded
            check_local_world(max(self.worlds), oversubscribe=self.oversubscribe)
        for backend in self.backends:
            check_backend(backend)
            if backend in TORCH_BACKENDS:
                from stepscope.distributed.launch.launcher import resolve_backend

                # nccl: one GPU per rank, checked for the largest world before anything starts
                resolve_backend(TORCH_BACKENDS[backend][0], max(self.worlds))


def resolve_auto(backends: tuple[str, ...], worlds: tuple[int, ...]) -> tuple[tuple[str, ...], str | None]:
    """`auto` in `backends` -> nccl when every rank has a GPU, else gloo (the launcher's rule, as in
    `stepscope ddp`), plus a note saying what was chosen and why (None without `auto`)."""
    if "auto" not in backends:
        return backends, None
    import torch

    from stepscope.distributed.launch.launcher import external_launch_env, resolve_backend

    external = external_launch_env()
    local = external["local_world_size"] if external else max(worlds, default=1)
    chosen = resolve_backend("auto", local)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    why = ("one GPU per rank" if chosen == "nccl"
           else f"nccl needs one GPU per rank: {local} local rank(s), {gpus} GPU(s)")
    resolved = tuple(dict.fromkeys(chosen if b == "auto" else b for b in backends))
    return resolved, f"backend auto: {chosen} ({why})"


def _check_choices(option: str, values: tuple, allowed: tuple) -> None:
    for value in values:
        if value not in allowed:
            raise UsageError(f"invalid {option} value {value!r} (choose from {', '.join(map(str, allowed))})")


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
    from stepscope.distributed.launch.launcher import external_launch_env

    external = external_launch_env()
    worlds = (external["world_size"],) if external else config.worlds
    jobs = []
    for backend in config.backends:
        for world in worlds:
            points, roundings, skipped = plan_points(
                backend=backend, world_size=world, ops=config.ops, sizes=config.sizes, dtypes=config.dtypes,
                modes=config.modes, places=config.places, iters=config.iters, warmup=config.warmup, root=config.root)
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


def run_comm(config: CommConfig, store: RecordStore | None, *, resume: bool = False,
             on_job: Callable[[JobResult], None] | None = None) -> list[JobResult]:
    """Every job of the request in order; `on_job` sees each as soon as it finishes."""
    results = []
    for job in plan_jobs(config):
        result = run_job(job, config, store, resume=resume)
        if result is None:
            continue
        results.append(result)
        if on_job is not None:
            on_job(result)
    return results


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
