"""What every rank shares, however it was started: the launch settings (`LaunchConfig`), what a rank knows
of its place (`RankContext`), the backend rule (`resolve_backend`) and joining the process group (`init_rank`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class LaunchConfig:
    """How to start ranks."""

    world_size: int = 2
    """Number of ranks to spawn locally (ignored under torchrun/Slurm, which set it)."""
    backend: str = "auto"
    """auto (nccl when every local rank has a GPU, else gloo), gloo or nccl."""
    threads: int | None = None
    """Intra-op CPU threads per rank; None = usable cores / local ranks (at least 1)."""
    timeout_s: float = 60.0
    """Collective timeout: a rank blocked this long on a peer raises instead of waiting forever."""
    teardown_s: float = 5.0
    """After a failure, how long ranks get to exit on SIGTERM before SIGKILL."""
    deadline_s: float | None = None
    """Optional limit on the whole run (a deadlocked program is stopped and reported)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address for locally spawned ranks."""
    oversubscribe: bool = False
    """Allow more than MAX_RANKS_PER_CORE locally spawned ranks per usable core."""


@dataclass(frozen=True)
class RankContext:
    """What a rank function knows about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: str
    """`cuda:<local_rank>` with nccl, else `cpu`."""
    timeout_s: float = 60.0
    """The collective timeout; pass it to `dist.new_group(timeout=...)` too (its default is 30 minutes)."""


def resolve_backend(backend: str, local_world_size: int) -> str:
    """`auto` -> nccl when there is one GPU per local rank, else gloo; nccl without enough GPUs is an error."""
    import torch
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose {'|'.join(BACKENDS)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if dist.is_nccl_available() and gpus >= local_world_size else "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus == 0:
            raise UsageError("backend nccl needs CUDA GPUs and a CUDA build of PyTorch (use --backend gloo)")
        if local_world_size > gpus:
            raise UsageError(f"backend nccl needs one GPU per rank: {local_world_size} local ranks but only "
                             f"{gpus} GPU(s) here")
    elif not dist.is_gloo_available():
        raise UsageError("this PyTorch build has no gloo backend")
    return backend


def default_threads(local_world_size: int) -> int:
    from stepscope.host import usable_cores

    return max(1, usable_cores() // max(1, local_world_size))


def init_rank(layout: dict[str, int], config: LaunchConfig, backend: str, store: Any | None) -> RankContext:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(config.threads or default_threads(layout["local_world_size"]))
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(layout["local_rank"])
        device = f"cuda:{layout['local_rank']}"
    timeout = dt.timedelta(seconds=config.timeout_s)
    if store is None:
        dist.init_process_group(backend, init_method="env://", rank=layout["rank"],
                                world_size=layout["world_size"], timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=layout["rank"], world_size=layout["world_size"],
                                timeout=timeout)
    return RankContext(rank=layout["rank"], world_size=layout["world_size"], local_rank=layout["local_rank"],
                       local_world_size=layout["local_world_size"], backend=backend, device=device,
                       timeout_s=config.timeout_s)
