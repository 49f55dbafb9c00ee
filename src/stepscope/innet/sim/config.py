"""`SimConfig`: the settings of one simulated in-network aggregation run, each default once, and their checks."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.innet.wire.protocol import VALUES_PER_PIPE, sto_ticks_from_ms

WORKLOADS = ("one", "waited", "batch")
EMULATOR_SWITCH_MPPS = 2.5
"""`stepscope innet switch-bench --payload 1K` on this project's 2-core AMD EPYC VM (one switch core, 2 ranks,
GSO/GRO, the C fast path, a quiet machine): 2.5 M packets in + out per CPU-second of the switch (the numpy
path: 0.45 M; docs/innet.md, "Before and after the C fast path")."""
EMULATOR_WORKER_MPPS = 0.65
"""`stepscope innet bench --world 2 --sizes 4M` (1 KiB packets) on the same machine, the C fast path: a worker
spends about 1.5 us of CPU per packet it sends and per result it takes, quantization included (the numpy path:
about 4.2 us; docs/innet.md)."""


@dataclass(frozen=True)
class SimConfig:
    """One simulated run."""

    workers: int = 6
    """Workers n (2-1024)."""
    link_Gbps: float = 100.0
    """Every worker's link line rate B in gigabits per second (10-400), both directions."""
    pipes: int = 4
    """Switch pipelines: k = 64 x pipes values per packet."""
    values_per_packet: int | None = None
    """Override k."""
    slots: int = 512
    """Slot pool s (packets in flight per worker)."""
    window: int | None = None
    """Outstanding packets per worker (None = slots)."""
    op_bytes: int = 100 << 20
    """Bytes per all-reduce (float32)."""
    workload: str = "one"
    """one op; `ops` ops each waited; or `ops` ops issued together (batch)."""
    ops: int = 100
    """Ops of the waited and batch workloads."""
    quantized: bool = True
    """float32 ops (an exponent prologue round per op); False = int32."""
    sto_ms: float = 1.0
    """Straggler timeout (rounded up to 65.536 us ticks)."""
    k: int | None = None
    """Fastest-K (None = workers)."""
    preemptive: bool = False
    """Complete at K contributions without the timer."""
    rto_ms: float = 0.25
    """Worker retransmission timeout (doubles per retry of a packet)."""
    rto_max_ms: float = 100.0
    """Largest retransmission timeout."""
    rtt_us: float = 10.0
    """Base round trip worker -> switch -> worker without serialization."""
    jitter_us: float = 1.0
    """Mean of the exponential one-way delay jitter per packet."""
    loss: float = 0.0
    """Loss probability per packet and direction."""
    duplicate: float = 0.0
    """Probability a worker's packet reaches the switch twice."""
    stall_prob: float = 1e-5
    """Chance a worker's host stalls before a packet (scheduling, interrupts: the natural skew)."""
    stall_us: float = 2000.0
    """Mean (exponential) host stall."""
    op_overhead_us: float = 20.0
    """Host time to issue one op; in batch mode issues queue up, so skew between workers grows."""
    issue_skew: float = 0.05
    """Relative spread of the per-worker issue speed (lognormal sigma)."""
    straggler_ranks: tuple[int, ...] = ()
    """Ranks that straggle."""
    straggler_ms: float = 0.0
    """Straggler delay before an op (mean if `straggler_dist` is exp)."""
    straggler_prob: float = 1.0
    """Chance a straggler rank straggles at an op."""
    straggler_dist: str = "fixed"
    """fixed or exp (exponential with mean straggler_ms)."""
    straggler_steps: tuple[int, int] | None = None
    """Inclusive range of ops (0-based, in issue order) where stragglers may straggle; None = every op."""
    switch_Mpps: float | None = None
    """Packets (in + out) per second, in millions, the switch handles; None: line rate (a Tofino). Every
    contribution costs the switch its own receive and its share of the multicast (as many results go out as
    contributions came in). EMULATOR_SWITCH_MPPS: `stepscope innet switch` measured on this project's machine."""
    worker_Mpps: float | None = None
    """Packets (sent + received) per second, in millions, a worker's host handles; None: line rate.
    EMULATOR_WORKER_MPPS: the emulator's worker measured on this project's machine."""
    seed: int = 0
    """Random seed."""

    @property
    def values(self) -> int:
        return self.values_per_packet or VALUES_PER_PIPE * self.pipes

    @property
    def min_count(self) -> int:
        return self.k or self.workers

    def validate(self) -> None:
        times = (self.sto_ms, self.rto_ms, self.rto_max_ms, self.rtt_us, self.jitter_us, self.stall_us,
                 self.op_overhead_us, self.straggler_ms)
        checks = [
            (all(math.isfinite(t) for t in times), "times must be finite numbers"),
            (not 0 <= self.sto_ms < math.inf or sto_ticks_from_ms(self.sto_ms) < 2**31,
             "--sto-ms beyond what the switch's timer holds (2^31 ticks)"),
            (2 <= self.workers <= 1024, "--world must be 2..1024"),
            (10 <= self.link_Gbps <= 400, "--link-Gbps must be 10..400"),
            (1 <= self.pipes <= 4, "--pipes must be 1..4"),
            (1 <= self.values <= 16368, "--values-per-packet must be 1..16368"),
            (1 <= self.slots <= 65535 and (self.window is None or 1 <= self.window <= self.slots),
             "--slots 1..65535 and --window 1..slots"),
            (self.op_bytes >= 4 and self.op_bytes % 4 == 0, "--op-bytes must be a positive multiple of 4"),
            (self.workload in WORKLOADS and self.ops >= 1, f"--workload {'|'.join(WORKLOADS)}, --ops >= 1"),
            (1 <= self.min_count <= self.workers, "-k must be 1..workers"),
            (self.sto_ms >= 0 and self.rto_ms > 0 and self.rto_max_ms >= self.rto_ms,
             "need sto >= 0 and 0 < rto <= rto-max"),
            (self.rtt_us >= 0 and self.jitter_us >= 0 and self.stall_us >= 0 and self.op_overhead_us >= 0,
             "times must be >= 0"),
            (0 <= self.loss < 1 and 0 <= self.duplicate <= 1 and 0 <= self.stall_prob <= 1
             and 0 <= self.straggler_prob <= 1, "probabilities must be in [0, 1] (loss < 1)"),
            (all(0 <= r < self.workers for r in self.straggler_ranks), "straggler ranks must be < workers"),
            (self.straggler_dist in ("fixed", "exp"), "--straggler dist must be fixed or exp"),
            (self.straggler_steps is None or 0 <= self.straggler_steps[0] <= self.straggler_steps[1],
             "--straggler steps must be N or A-B with 0 <= A <= B"),
            (all(rate is None or 0 < rate < math.inf for rate in (self.switch_Mpps, self.worker_Mpps)),
             "--switch-Mpps and --worker-Mpps must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
