"""How `innet bench`, `timeout-profile` and `train` run, in one place: the world size (the one torchrun or
Slurm started, when they started the ranks), the switch (a named one must answer before any work; else one
is started for the run, recording its counters beside the run's), the records file proven writable first,
and the ranks launched against that switch.

    config, store = start_run(config, out, switch, "innet-bench")   # all checked; nothing started or written
    results = run_ranks(bench_rank, config, out, out=out, switch=switch, timeout_s=120)  # None off rank 0
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from stepscope.distributed.launch.launcher import LaunchConfig, launch
from stepscope.distributed.launch.ranks import external_launch_env
from stepscope.errors import UsageError
from stepscope.innet.switch.process import SwitchProcess, probe
from stepscope.innet.worker.config import JobConfig
from stepscope.results.store import RecordStore


class RunConfig(Protocol):
    """What the runner needs of a command's config (`BenchConfig`, `ProfileConfig`, `TrainConfig`)."""

    @property
    def world(self) -> int: ...

    @property
    def job(self) -> JobConfig: ...

    def validate(self) -> None: ...


C = TypeVar("C", bound=RunConfig)


@dataclass
class RunOutcome(Generic[C]):
    """What a run measured (rank 0): its config as run (at the launcher's world size), a row per point."""

    config: C
    rows: list[dict[str, Any]]
    records: Path | None
    """The records file the run appended to (None: no records)."""


def launch_world(world: int) -> int:
    """`world`, or the world size torchrun/Slurm started (records must name the real one)."""
    external = external_launch_env()
    return external["world_size"] if external else world


def check_switch(switch: str | None) -> None:
    """A named switch must answer before any work starts (a wrong address is bad input). Under
    torchrun/Slurm every rank runs the command: they must share one switch instead of starting their own."""
    if not switch:
        if external_launch_env() is not None:
            raise UsageError("under torchrun or Slurm, start `stepscope innet switch` once and pass --switch HOST:PORT")
        return
    JobConfig(switch=switch).address()  # host:port at all, before asking anything there
    probe(switch)


def check_job(job: JobConfig, world: int, **settings: Any) -> None:
    """The job template as rank 0 of `world` (with `settings` in place), its straggler among those ranks."""
    replace(job, rank=0, world=world, **settings).validate()
    if job.faults.straggler is not None:
        job.faults.straggler.validate(world)


def record_settings(config: Any) -> dict[str, Any]:
    """A run's configuration as its records hold it: every field, the job's as the settings ranks share."""
    out = asdict(config)
    out["job"] = replace(config.job, world=config.world).shared_settings()
    return out


def start_run(config: C, out: str | os.PathLike | None, switch: str | None, kind: str) -> tuple[C, RecordStore | None]:
    """`config` at the world the ranks will have, validated; the switch checked; `<out>/<kind>.jsonl` proven
    writable (None: no records). In this order, so bad input starts nothing and leaves no file behind."""
    config = replace(config, world=launch_world(config.world))
    config.validate()
    check_switch(switch)
    return config, (RecordStore(out, kind).check_writable() if out is not None else None)


def run_ranks(rank_fn: Callable[..., Any], config: C, *args: Any, out: str | os.PathLike | None, switch: str | None,
              timeout_s: float, job_MiB: int | None = None, shards: int = 1) -> list[Any] | None:
    """`rank_fn(ctx, config, *args)` on `config.world` ranks, `config.job.switch` set to the run's switch;
    every rank's result (None on the ranks other than 0 under torchrun/Slurm). `job_MiB`: the memory the job
    needs on a switch started for the run, when more than a switch allows a job by default; `shards`: switch
    processes of a switch started for the run."""
    with _switch_for(switch, out, job_MiB, shards) as address:
        run = replace(config, job=replace(config.job, switch=address))
        return launch(rank_fn, run, *args, config=LaunchConfig(world_size=config.world, threads=1, timeout_s=timeout_s))


@contextmanager
def _switch_for(switch: str | None, out: str | os.PathLike | None, job_MiB: int | None = None,
                shards: int = 1) -> Iterator[str]:
    """The named switch (checked by `start_run`), or a switch process for the run (its counters recorded in
    `out`, if given), stopped when the run ends however it ends."""
    if switch:
        yield switch
        return
    extra = (*(("--max-job-MiB", str(job_MiB)) if job_MiB else ()), "--shards", str(shards))
    with SwitchProcess(extra_args=extra, out_dir=None if out is None else str(out)) as process:
        yield process.address
