"""Who starts the ranks of a distributed run, and how many ranks may be spawned on this machine.

- torchrun (or anything setting RANK and WORLD_SIZE): this process is one rank.
- Slurm: this process is one rank only when it is a task of a job step started by `srun`: SLURM_PROCID
  is set, the step id (SLURM_STEP_ID, or the older SLURM_STEPID) is an ordinary step number, and the
  step has more than one task (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS). An `sbatch` script run without
  srun is not a task: Slurm gives it SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but no step id or
  the batch step's (`batch`, 4294967294 before Slurm 20.11, 4294967291 after; `extern` and
  `interactive` likewise). There, and in an `salloc` shell, the ranks are spawned locally (`--world`).
- otherwise the ranks are spawned locally: at most MAX_RANKS_PER_CORE per usable core, unless the caller
  oversubscribes (`stepscope comm --oversubscribe`, or STEPSCOPE_OVERSUBSCRIBE=1 for any command).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from stepscope.errors import UsageError

MAX_RANKS_PER_CORE = 8
"""Local spawn limit: every rank is a Python process that imports torch (1-2 s of CPU and 200-300 MB to
start), so far beyond this, start-up alone outlasts the timeouts and timings mean nothing; 8 per core still
lets a 2-core laptop run 16-rank correctness checks."""
OVERSUBSCRIBE_ENV = "STEPSCOPE_OVERSUBSCRIBE"
"""Set to 1 to lift MAX_RANKS_PER_CORE for every command."""
_SLURM_RESERVED_STEP = 0xFFFFFFF0
"""Step ids from here up are not srun steps: batch (0xfffffffe, or 0xfffffffb since 20.11), extern,
interactive, pending."""


def external_launch_env() -> dict[str, int] | None:
    """Rank layout set by torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or by srun for the tasks of a Slurm job
    step (see the module docstring for the rule), else None: ranks are to be spawned here."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return {"rank": int(env["RANK"]), "world_size": world, "local_rank": int(env.get("LOCAL_RANK", 0)),
                "local_world_size": int(env.get("LOCAL_WORLD_SIZE", world))}
    if not is_slurm_step_task(env):
        return None
    world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    if world < 2:
        return None  # a one-task step (`srun -n1 stepscope ...`) spawns its ranks like a shell would
    # per-node task counts such as "2(x3),1": this node's entry (SLURM_NODEID), else the first
    counts = _slurm_counts(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
                           or env.get("SLURM_TASKS_PER_NODE", ""))
    node = int(env.get("SLURM_NODEID", 0)) if env.get("SLURM_NODEID", "").isdigit() else 0
    local_world = counts[node] if node < len(counts) else (counts[0] if counts else world)
    return {"rank": int(env["SLURM_PROCID"]), "world_size": world,
            "local_rank": int(env.get("SLURM_LOCALID", 0)), "local_world_size": max(1, min(local_world, world))}


def effective_world(requested: int) -> int:
    """The world size of this run: torchrun's or Slurm's when they started this process, else `requested`
    (records must name the real one)."""
    external = external_launch_env()
    return external["world_size"] if external else requested


def is_slurm_step_task(env: Mapping[str, str] | None = None) -> bool:
    """True for a task srun started in a job step; False in an sbatch script, an salloc shell, or outside
    Slurm (those have no step id, or a reserved one such as `batch`)."""
    env = os.environ if env is None else env
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return "SLURM_PROCID" in env and step is not None and step.isdigit() and int(step) < _SLURM_RESERVED_STEP


def _slurm_counts(text: str) -> list[int]:
    """Slurm's compressed per-node counts: "2(x3),1" -> [2, 2, 2, 1]; [] when unreadable."""
    counts: list[int] = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def check_local_world(world_size: int, *, oversubscribe: bool = False) -> None:
    """Refuse (UsageError) to spawn more than MAX_RANKS_PER_CORE ranks per usable core here, before any
    process starts, unless `oversubscribe` or STEPSCOPE_OVERSUBSCRIBE=1."""
    from stepscope.host import usable_cores

    if oversubscribe or os.environ.get(OVERSUBSCRIBE_ENV, "").strip() not in ("", "0"):
        return
    cores = usable_cores()
    limit = MAX_RANKS_PER_CORE * cores
    if world_size > limit:
        raise UsageError(f"{world_size} local ranks is more than this machine can run: the limit is {limit} "
                         f"({MAX_RANKS_PER_CORE} per usable CPU core, {cores} here); pass --oversubscribe (or set "
                         f"{OVERSUBSCRIBE_ENV}=1) to start them anyway")
