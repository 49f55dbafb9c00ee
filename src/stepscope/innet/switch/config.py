"""`SwitchConfig`: where the switch listens, how much it may hold, how many shards serve it. No sockets here (the
command line reads its defaults)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from stepscope.errors import UsageError


@dataclass(frozen=True)
class SwitchConfig:
    """Where the switch listens and how much it may hold."""

    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 to serve other machines)."""
    port: int = 9000
    """UDP port; 0 lets the OS pick (the chosen port is in `Switch.address`)."""
    max_jobs: int = 64
    """Jobs served at once; a JOIN beyond this is rejected."""
    max_job_bytes: int = 256 << 20
    """Memory one job may take (slots x values x 2 versions, stored results, history)."""
    idle_s: float = 300.0
    """A job without any packet for this long is forgotten (its ranks are gone)."""
    evict_after_s: float = 5.0
    """With the table full, a new job may evict a job that never completed a block and was silent this long."""
    poll_s: float = 0.05
    """Longest wait on the socket, so a stop request is seen promptly."""
    finished_jobs_kept: int = 256
    """Counters of finished jobs kept for the exit summary."""
    offload: bool = True
    """Use UDP segmentation offload (GSO out, GRO in) where the kernel has it (`wire.batch_io`)."""
    shards: int = 1
    """Switch processes, one port each (port, port + 1, ...; with port 0 each picks one): slot j of every job is
    served by shard j mod shards, so several cores aggregate (workers send each slot to its shard)."""
    cpus: tuple[int, ...] = ()
    """Cores to pin shard i on (cpus[i mod len]); empty: the OS schedules them."""

    def validate(self) -> None:
        if not 0 <= self.port < 65_536:
            raise UsageError(f"--port must be 0..65535, got {self.port}")
        if not 1 <= self.shards <= 64 or (self.port and self.port + self.shards > 65_536):
            raise UsageError(f"--shards must be 1..64 with ports below 65536, got {self.shards}")
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(self.cpus)
        if any(cpu not in usable for cpu in self.cpus):
            raise UsageError(f"--cpus {','.join(map(str, self.cpus))}: this process may use cores "
                             f"{','.join(map(str, sorted(usable)))}")

    def shard(self, index: int) -> SwitchConfig:
        """The config shard `index` listens with (its own port)."""
        return replace(self, port=self.port + index if self.port else 0, shards=1)
