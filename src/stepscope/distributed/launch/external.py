"""A launch under torchrun or an srun job step: this process is one rank; the launcher's environment says which
(`ranks.external_launch_env`), and results are gathered on rank 0. A rendezvous that fails (a peer that never
starts, a wrong MASTER_ADDR/PORT) ends after `timeout_s` with a one-line `RendezvousError`."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from stepscope.distributed.launch.rank import LaunchConfig, init_rank, resolve_backend
from stepscope.errors import RendezvousError


def launch_external(fn: Callable[..., Any], args: tuple, config: LaunchConfig,
                     layout: dict[str, int]) -> list[Any] | None:
    """Under torchrun/Slurm: this process is one rank; results are gathered on rank 0."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
    os.environ.setdefault("MASTER_PORT", "29500")
    backend = resolve_backend(config.backend, layout["local_world_size"])
    try:
        with _held_stderr():
            ctx = init_rank(layout, config, backend, None)
    except (getattr(dist, "DistError", RuntimeError), ValueError) as error:
        # DistStoreError (rank 0: peers never joined), DistNetworkError (master unreachable), a malformed
        # MASTER_PORT: a setup problem, said in one line instead of torch's traceback
        cause = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
        address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise RendezvousError((
            f"rank {layout['rank']} of {layout['world_size']}: no process group formed at {address} within "
            f"{config.timeout_s:g} s ({cause}); check that MASTER_ADDR/MASTER_PORT name a host every rank can "
            f"reach and a port free there, and that all {layout['world_size']} ranks were started (torchrun "
            "--nnodes/--nproc-per-node, srun -n)"), rank=layout["rank"]) from None
    try:
        value = fn(ctx, *args)
        gathered: list[Any] | None = [None] * ctx.world_size if ctx.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _held_stderr() -> Any:
    """Hold what is written to file descriptor 2 meanwhile: replayed when the block succeeds, dropped when
    it raises (a failed TCPStore connect logs a C++ stack per retry; RendezvousError says it in one line)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2: nothing to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if succeeded:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)
