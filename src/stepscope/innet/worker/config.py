"""One rank's settings of an in-network aggregation job (`JobConfig`: switch, packets, timers, faults) and
the job id every rank of a run shares. No sockets here: the worker (`stepscope.innet.worker.client`) runs a job."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from stepscope.errors import UsageError
from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.faults import FaultConfig

WINDOW_BYTES = 4 << 20
"""Default bound of one worker's datagrams in flight, the socket buffer it asks for (on 2 cores with 16 KiB
packets, one run each: 64 in flight took 159 ms per 4 MiB op, 256 took 94 ms; 512 overflowed the buffers and
retransmitted half of the packets)."""


@dataclass(frozen=True)
class JobConfig:
    """One rank's view of an in-network aggregation job."""

    switch: str = "127.0.0.1:9000"
    """host:port of the switch; a sharded switch: host:port,host:port,... (slot j goes to shard j mod shards)."""
    job_id: int = 1
    """Job (session) id, the same on every rank; jobs never mix at the switch."""
    rank: int = 0
    """This worker's rank, 0..world-1."""
    world: int = 1
    """Number of workers in the job."""
    pipes: int = 4
    """Switch pipelines (1-4): k = 64 values per pipe per packet on a Tofino."""
    values_per_packet: int | None = None
    """k, values per packet; None = 64 x pipes (emulation may use more, up to 16368)."""
    slots: int = 512
    """Slot pool size s: packets in flight per job (two shadow versions each at the switch). Batched I/O needs
    deep windows: on 2 cores, 4 MiB per op at 1 KiB per packet took 892 ms with 64 slots, 248 ms with 512
    (one session, docs/innet.md)."""
    window: int | None = None
    """Most packets outstanding at once on this worker; None = slots, at most WINDOW_BYTES of datagrams."""
    sto_ms: float = 1.0
    """Straggler timeout in ms, rounded up to switch ticks of 65.536 us."""
    sto_ticks: int | None = None
    """Straggler timeout in switch ticks (overrides sto_ms)."""
    history: int = 1024
    """Completed results the switch keeps for ranks that fall behind (fastest-K runs)."""
    rto_ms: float | None = None
    """First retransmission timeout of a packet in ms; None = adaptive (srtt + 4 rttvar). Multiplied by
    `backoff` after every retransmission of the same packet."""
    rto_min_ms: float = 5.0
    """Smallest adaptive retransmission timeout (a block's round trip includes the slowest rank's
    scheduling delay, milliseconds on a shared CPU; shorter timeouts mostly resend packets not lost)."""
    backoff: float = 2.0
    """Retransmission timeout multiplier per retransmission of the same packet."""
    rto_max_ms: float = 200.0
    """Largest retransmission timeout."""
    timeout_s: float = 30.0
    """An op without progress for this long fails (switch gone, peer gone) instead of hanging."""
    connect_timeout_s: float = 5.0
    """How long JOIN may go unanswered before the switch counts as unreachable."""
    join_timeout_s: float = 120.0
    """How long `join(wait_all=True)` waits for the other ranks to join."""
    sender_threads: int = 0
    """Threads that quantize and send packets (0: the I/O thread does it)."""
    stash_limit_bytes: int = 256 << 20
    """Results of ops this rank has not started yet (it is late) kept at most."""
    offload: bool = True
    """UDP segmentation offload (GSO out, GRO in) where the kernel has it (`wire.batch_io`)."""
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Injected network faults."""

    @property
    def k(self) -> int:
        return self.values_per_packet or p.VALUES_PER_PIPE * self.pipes

    @property
    def resolved_window(self) -> int:
        """Packets in flight: `window`, or the slots, within WINDOW_BYTES (deeper queues overflow socket
        buffers on loopback and come back as retransmissions)."""
        if self.window is not None:
            return self.window
        return max(1, min(self.slots, WINDOW_BYTES // (p.HEADER_BYTES + 4 * self.k)))

    @property
    def resolved_sto_ticks(self) -> int:
        return self.sto_ticks if self.sto_ticks is not None else p.sto_ticks_from_ms(self.sto_ms)

    def address(self) -> tuple[str, int]:
        """The (first) switch address."""
        return self.addresses()[0]

    def addresses(self) -> list[tuple[str, int]]:
        """The address of every switch shard."""
        out = []
        for part in self.switch.split(","):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
                raise UsageError(f"switch address must be host:port (shards: host:port,host:port), got "
                                 f"{self.switch!r}")
            out.append((host, int(port)))
        return out

    def validate(self) -> None:
        self.address()
        if not 1 <= self.world <= p.MAX_WORLD or not 0 <= self.rank < self.world:
            raise UsageError(f"rank {self.rank} / world {self.world} invalid (world 1..{p.MAX_WORLD})")
        if not 1 <= self.pipes <= p.MAX_PIPES:
            raise UsageError(f"pipes must be 1..{p.MAX_PIPES}, got {self.pipes}")
        if not 1 <= self.k <= p.MAX_VALUES:
            raise UsageError(f"values per packet must be 1..{p.MAX_VALUES}, got {self.k}")
        if not 1 <= self.slots <= 65_535 or (self.window is not None and not 1 <= self.window <= self.slots):
            raise UsageError("slots must be 1..65535 and the window 1..slots")
        if not (0 <= self.sto_ms < math.inf) or (self.sto_ticks is not None and self.sto_ticks < 0):
            raise UsageError("the straggler timeout must be a finite number >= 0")
        rto = self.rto_ms if self.rto_ms is not None else self.rto_min_ms
        if not all(math.isfinite(v) for v in (rto, self.rto_min_ms, self.rto_max_ms, self.backoff)) or (
                rto <= 0 or self.rto_min_ms <= 0 or self.backoff < 1 or self.rto_max_ms < rto):
            raise UsageError("need finite rto > 0, backoff >= 1 and rto-max >= rto")
        # job 0 is the switch's own: STATS for job 0 are the switch totals
        if not 1 <= self.job_id < 2**32:
            raise UsageError(f"job id must be 1..2^32-1, got {self.job_id}")
        problem = self.join_params().problem()  # what the switch would refuse, said before anything starts
        if problem:
            raise UsageError(problem)
        self.faults.validate()

    def join_params(self) -> p.JoinParams:
        return p.JoinParams(self.k, self.slots, self.resolved_sto_ticks, self.history)

    def shared_settings(self) -> dict[str, Any]:
        """The settings every rank of a run shares, for records (not its rank, job id or switch address)."""
        return {k: v for k, v in asdict(self).items() if k not in ("rank", "job_id", "switch")}


def new_job_id() -> int:
    """A random job id (jobs of one switch must not collide)."""
    return random.SystemRandom().randrange(1, 2**31)


def shared_job_id() -> int:
    """One new job id for every rank of the initialized torch.distributed group (rank 0 draws it)."""
    import torch.distributed as dist

    box = [new_job_id() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
