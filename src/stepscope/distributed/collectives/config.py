"""A collective benchmark request (`CommConfig`) and how `auto` becomes a backend: torch-free, so the command line
reads the defaults without importing torch; `validate` checks the request against this machine."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.distributed.collectives.backends import check_backend
from stepscope.distributed.collectives.ops import DTYPES, OPS, ROOTED_OPS
from stepscope.distributed.collectives.points import CALL_MODES, PLACES
from stepscope.distributed.collectives.sizes import parse_sizes
from stepscope.errors import UsageError

MAX_SKEW = 8.0
"""Beyond this Zipf exponent the hottest rank receives practically everything: nothing more to see."""
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
    sizes: tuple[int, ...] = tuple(parse_sizes("1K:16M:x4"))
    """Requested sizes in bytes (S after nccl-tests rounding): 1 KiB to 16 MiB in steps of x4."""
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
    skews: tuple[float, ...] = (1.0,)
    """all_to_allv: Zipf exponents of the token-per-expert popularity, one point each (0: equal split;
    1 on 4 ranks: the hottest rank receives 1.92x the mean)."""
    seed: int = 0
    """all_to_allv: seed of which ranks are hot (every rank derives the same split matrix from it)."""
    threads: int | None = None
    """CPU threads per rank (None: cores / local ranks)."""
    timeout_s: float = 300.0
    """A rank blocked this long on a peer (torch) or a job silent this long (mpi) is stopped."""
    tally: bool = False
    """Also profile each point for the per-backend tables."""
    syscalls: bool = False
    """Run each job again under strace and tally what the backend does beneath its API (`syscall_tally`)."""
    oversubscribe: bool = False
    """Allow more locally started ranks than launch_env.MAX_RANKS_PER_CORE per core."""

    def validate(self) -> None:
        """Raise UsageError for anything that cannot run here, before any work starts."""
        for name, values in (("--backend", self.backends), ("--world", self.worlds), ("--op", self.ops),
                             ("--sizes", self.sizes), ("--dtype", self.dtypes), ("--call-mode", self.modes),
                             ("--place", self.places)):
            if not values:
                raise UsageError(f"{name} needs at least one value")
        _check_choices("--op", self.ops, OPS)
        _check_choices("--dtype", self.dtypes, tuple(DTYPES))
        _check_choices("--call-mode", self.modes, CALL_MODES)
        _check_choices("--place", self.places, PLACES)
        if min(self.worlds) < 1:
            raise UsageError(f"world sizes must be at least 1, got {min(self.worlds)}")
        if not self.skews or min(self.skews) < 0 or max(self.skews) > MAX_SKEW:
            raise UsageError(f"--skew takes values from 0 (equal split) to {MAX_SKEW:g}, got "
                             f"{', '.join(f'{s:g}' for s in self.skews) or 'none'}")
        if self.iters < 1 or self.warmup < 0:
            raise UsageError("--iters must be positive and --warmup non-negative")
        if self.timeout_s <= 0:
            raise UsageError("--timeout must be positive")
        if any(op in ROOTED_OPS for op in self.ops) and not 0 <= self.root < min(self.worlds):
            raise UsageError(f"--root {self.root} is not a rank of the smallest world ({min(self.worlds)} ranks)")
        from stepscope.distributed.launch.ranks import check_local_world, external_launch_env

        if external_launch_env() is None:  # stepscope starts the ranks itself (spawn or mpiexec): bounded
            check_local_world(max(self.worlds), oversubscribe=self.oversubscribe)
        elif self.syscalls:
            raise UsageError("--tally syscalls traces the ranks stepscope starts itself; under torchrun or srun, "
                             "run stepscope comm without a launcher")
        if self.syscalls:
            from stepscope.distributed.tracing.strace import find_strace

            find_strace()  # absent or not permitted: one line, before anything runs
        for backend in self.backends:
            check_backend(backend)
            if backend in TORCH_BACKENDS:
                from stepscope.distributed.launch.rank import resolve_backend

                # nccl: one GPU per rank, checked for the largest world before anything starts
                resolve_backend(TORCH_BACKENDS[backend][0], max(self.worlds))


def resolve_auto(backends: tuple[str, ...], worlds: tuple[int, ...]) -> tuple[tuple[str, ...], str | None]:
    """`auto` in `backends` -> nccl when every rank has a GPU, else gloo (the launcher's rule, as in
    `stepscope ddp`), plus a note saying what was chosen and why (None without `auto`)."""
    if "auto" not in backends:
        return backends, None
    import torch

    from stepscope.distributed.launch import external_launch_env, resolve_backend

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
