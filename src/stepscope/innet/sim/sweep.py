"""`stepscope innet simulate`'s sweep: every `SimConfig` through the simulator, one `innet-simulate` record
each (appended as it finishes), and the row the command prints for it. No sockets, no torch.

    outcome = run_simulate([SimConfig(sto_ms=sto) for sto in (0.05, 1.0)], "out")   # out/innet-simulate.jsonl
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.innet.sim.config import SimConfig
from stepscope.innet.sim.model import simulate
from stepscope.innet.worker.faults import StragglerSpec
from stepscope.results.environment import base_environment
from stepscope.results.store import RecordStore
from stepscope.results.sweep import Sweep

SETTINGS = ("workers", "link_Gbps", "pipes", "slots", "workload", "sto_ms", "rto_ms", "loss", "op_bytes")
"""The settings a row shows beside the results (and `k`, the fastest-K in effect)."""


@dataclass
class SimOutcome:
    """The sweep's records and rows (in config order) and where the records went."""

    records: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    path: Path | None
    """`<out>/innet-simulate.jsonl` (None: no records)."""

    @property
    def packets(self) -> int:
        """Packets simulated over the whole sweep."""
        return sum(row["sim_packets"] for row in self.rows)

    @property
    def packets_per_s(self) -> float:
        """The simulator's own speed over the sweep (simulated packets per second of wall time)."""
        return self.packets / max(sum(row["wall_s"] for row in self.rows), 1e-9)


def straggler_settings(text: str) -> dict[str, Any]:
    """SimConfig's straggler fields from a `--straggler` spec: `StragglerSpec`'s items plus `dist=fixed|exp`
    (the simulator can also draw exponential delays)."""
    items = text.split(";")
    dists = [item.split("=", 1)[1].strip() for item in items if item.strip().startswith("dist=")]
    spec = StragglerSpec.parse(";".join(item for item in items if not item.strip().startswith("dist=")))
    return dict(straggler_ranks=spec.ranks, straggler_ms=spec.delay_s * 1e3, straggler_prob=spec.probability,
                straggler_dist=dists[-1] if dists else SimConfig.straggler_dist, straggler_steps=spec.steps)


def run_simulate(configs: Sequence[SimConfig], out: str | os.PathLike | None = None) -> SimOutcome:
    """Simulate every config (all validated first) and append its `innet-simulate` record to
    `<out>/innet-simulate.jsonl` (None: records are only returned)."""
    for config in configs:
        config.validate()
    env = base_environment()
    rows: list[dict[str, Any]] = []

    def measure(config: SimConfig) -> tuple[dict[str, Any], dict[str, Any]]:
        result = simulate(config)
        return result, result

    def add_row(_record: dict[str, Any], config: SimConfig, result: dict[str, Any]) -> None:
        rows.append({**{name: getattr(config, name) for name in SETTINGS}, "k": config.min_count, **result})

    # a simulation that runs out of memory is a bug to see, not a row: nothing is an `oom` point here
    sweep = Sweep(kind="innet-simulate", points=configs, config_of=SimConfig.to_dict, measure=measure,
                  env_of=lambda _: env, is_oom=lambda _: False)
    outcome = sweep.run(out, on_record=add_row)
    return SimOutcome(outcome.records, rows, None if out is None else RecordStore(out, "innet-simulate").path)
