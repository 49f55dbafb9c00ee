"""Distributed execution: the launcher every distributed command uses, collectives benchmark, DDP variants,
bucket planner, sharded optimizer."""

from stepscope.dist.launcher import DistributedError, LaunchConfig, RankContext, launch

__all__ = ["DistributedError", "LaunchConfig", "RankContext", "launch"]
