"""A collective sweep on mpi4py ranks: `launch.mpi` starts the mpiexec job running `mpi_rank`, rank 0
reports each finished point (its record, already appended to the store, and every rank's raw tally).

    outcome = run_mpi(points, world_size=4, out_dir="stepscope-results", timeout_s=300)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.launch.mpi import run_mpi_module
from stepscope.errors import DistributedError

RANK_MODULE = "stepscope.distributed.collectives.mpi_rank"


@dataclass
class MpiOutcome:
    """Records rank 0 wrote (in order) and, per record, every rank's raw tally (or None)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tallies: list[list[dict[str, Any]] | None] = field(default_factory=list)


def run_mpi(points: list[CommPoint], *, world_size: int, out_dir: str | None, tally: bool = False,
            timeout_s: float = 300.0, on_point: Callable[[dict[str, Any]], None] | None = None) -> MpiOutcome:
    """Measure `points` on `world_size` mpi4py ranks (raises DistributedError if the job fails or stalls)."""
    outcome = MpiOutcome()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "point":
            outcome.records.append(event["record"])
            outcome.tallies.append(event.get("tallies"))
            if on_point is not None:
                on_point(event["record"])

    payload = {"points": [dataclasses.asdict(p) for p in points], "out_dir": out_dir, "tally": tally}
    run_mpi_module(RANK_MODULE, payload, world_size=world_size, timeout_s=timeout_s, on_event=on_event)
    if len(outcome.records) < len(points):
        raise DistributedError(f"the MPI job reported {len(outcome.records)} of {len(points)} point(s)")
    return outcome
