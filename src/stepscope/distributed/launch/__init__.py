"""Starting ranks and stopping them: `launch(fn, *args, config=LaunchConfig(...))` runs `fn(ctx, *args)` on
every rank (spawned here, or this process under torchrun / an srun job step); `ranks` says who starts them and
how many a machine may run; `teardown` is the one way every launcher path stops processes (spawned ranks, an
mpiexec job, the innet switch process); `mpi` starts and follows an mpiexec job.

May import: errors, host. Imports torch only inside the functions that start or initialize ranks.
"""

from stepscope.distributed.launch.launcher import launch
from stepscope.distributed.launch.rank import LaunchConfig, RankContext, resolve_backend
from stepscope.distributed.launch.ranks import MAX_RANKS_PER_CORE, check_local_world, external_launch_env

__all__ = ["LaunchConfig", "RankContext", "launch", "resolve_backend", "MAX_RANKS_PER_CORE", "check_local_world",
           "external_launch_env"]
