"""`stepscope innet switch-bench`: the switch alone, driven by a packet generator (`generator.Generator`) at a
given packet size and rate, without workers in the way: packets per second in and out and GB/s it sustains.

The switch is a real `stepscope innet switch` process (`--shards` of them: one port and process each), pinned to
its own cores (shard i on core i); the generator runs here, on the cores left (all of them when none is left).
Every point runs `repeats` times, the points interleaved (A B A B ...), and its record holds the medians:

    in/out_pps        datagrams the switch received / sent per second of the point (its own counters)
    total_pps         in + out: the switch's aggregated packet rate
    total_GBps        (in + out) x datagram bytes (32-byte header + payload; no UDP/IP framing) per second
    switch_cores      CPU time of the switch process(es) per second of the point (at most the shards)
    total_pps_per_core  total_pps / switch_cores: the rate one fully busy core sustains

A rate of 0 offers as much as the switch answers (each generator rank keeps `window` packets in flight); a
positive rate caps the offered input (all ranks together). Every result's first and last value is checked
(`wrong`); a lost packet stops a point (`stalled`: the generator does not retransmit). Records: `innet-switch`
with config `"record": "bench"` in `<out>/innet-switch.jsonl`.
"""

from __future__ import annotations

import os
import random
import statistics
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError
from stepscope.innet.runs.generator import Generator
from stepscope.innet.switch.process import SwitchProcess, probe
from stepscope.innet.wire import protocol as p
from stepscope.results.environment import base_environment
from stepscope.results.store import RecordStore, make_record

WINDOW_BYTES = 1 << 20
"""Default datagrams in flight per generator rank (a quarter of the switch's 4 MiB socket buffer per rank)."""


@dataclass(frozen=True)
class SwitchBenchConfig:
    """One `innet switch-bench` run."""

    payload_bytes: tuple[int, ...] = (1024, 16384)
    """Values per packet x 4 (multiples of 4, up to 65,472)."""
    world: tuple[int, ...] = (2,)
    """Ranks the generator plays (each result goes back to every one)."""
    rates_pps: tuple[float, ...] = (0.0,)
    """Offered input packets per second (all ranks); 0: as fast as the switch answers."""
    shards: tuple[int, ...] = (1,)
    """Switch processes (one core each where there are enough)."""
    offload: tuple[bool, ...] = (True,)
    """UDP segmentation offload on (GSO/GRO) or off (one datagram per message), both sides."""
    slots: int = 2048
    """Slots of the generator's job (rows at the switch: twice as many)."""
    window: int | None = None
    """Packets in flight per generator rank; None: WINDOW_BYTES of datagrams, at most the slots."""
    duration_s: float = 2.0
    """Measured seconds per point and repeat."""
    warmup_s: float = 0.3
    """Unmeasured seconds before each measurement."""
    repeats: int = 3
    """Interleaved repeats per point (the record holds medians)."""

    def validate(self) -> None:
        if any(size < 4 or size % 4 or size > 4 * p.MAX_VALUES for size in self.payload_bytes):
            raise UsageError(f"--payload must be multiples of 4 bytes up to {4 * p.MAX_VALUES}")
        if any(not 1 <= w <= p.MAX_WORLD for w in self.world) or any(r < 0 for r in self.rates_pps):
            raise UsageError(f"--world must be 1..{p.MAX_WORLD} and --rate >= 0")
        if any(not 1 <= s <= 64 for s in self.shards) or not 1 <= self.slots <= 65_535:
            raise UsageError("--shards must be 1..64 and --slots 1..65535")
        if (self.window is not None and not 1 <= self.window <= self.slots) or self.repeats < 1:
            raise UsageError("--window must be 1..slots and --repeats >= 1")
        if not 0 < self.duration_s <= 600 or not 0 <= self.warmup_s <= 600:
            raise UsageError("--duration-s must be in (0, 600] and --warmup-s in [0, 600]")

    def points(self) -> list[dict[str, Any]]:
        return [{"payload_bytes": size, "world": world, "rate_pps": rate, "shards": shards, "offload": offload}
                for size in self.payload_bytes for world in self.world for rate in self.rates_pps
                for shards in self.shards for offload in self.offload]


@dataclass
class SwitchBenchOutcome:
    """Rows (one per point, medians over repeats) and where the records went."""

    rows: list[dict[str, Any]]
    records: Path | None

    @property
    def data_paths(self) -> str:
        """Which data path the switch and the generator ran (`wire.fastpath`), in words."""
        paths = sorted({(row["switch_data_path"], row["generator_data_path"]) for row in self.rows})
        return ", ".join(f"data path {switch} (generator: {generator})" for switch, generator in paths)


def run_switch_bench(config: SwitchBenchConfig, out: str | os.PathLike | None = None, *,
                     switch: str | None = None) -> SwitchBenchOutcome:
    """Measure every point of `config` (see the module docstring); one record per point in
    `<out>/innet-switch.jsonl` (None: none). `switch`: drive that running switch (host:port, shards as a comma
    list) instead of starting one; its shards, offload and cores are its own (its CPU time if it reports it)."""
    config.validate()
    if switch:
        probe(switch)  # a wrong address is bad input, before anything runs
    store = RecordStore(out, "innet-switch").check_writable() if out is not None else None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    samples: dict[int, list[dict[str, Any]]] = {}
    points = config.points()
    with ExitStack() as stack:
        switches = {}
        for shards, offload in sorted({(pt["shards"], pt["offload"]) for pt in points}):
            if switch:
                switches[(shards, offload)] = (_Running(switch), [])
                continue
            switch_cores = cores[:shards] if len(cores) > shards else []
            extra = ("--shards", str(shards), *(("--cpus", ",".join(map(str, switch_cores))) if switch_cores
                                                 else ()), *(() if offload else ("--no-offload",)))
            switches[(shards, offload)] = (stack.enter_context(SwitchProcess(extra_args=extra)), switch_cores)
        for _ in range(config.repeats):
            for number, point in enumerate(points):
                process, switch_cores = switches[(point["shards"], point["offload"])]
                generator_cores = [c for c in cores if c not in switch_cores] or cores
                samples.setdefault(number, []).append(_measure(config, point, process.address, generator_cores))
    env = base_environment()
    rows = []
    for number, point in enumerate(points):
        metrics = _medians(samples[number])
        rows.append({**point, **metrics})
        if store is not None:
            store.append(make_record("innet-switch", {"record": "bench", **point, **_settings(config),
                                                      "switch": switch}, metrics, env=env))
    return SwitchBenchOutcome(rows, None if store is None else store.path)


@dataclass
class _Running:
    """A switch this run did not start."""

    address: str


def _settings(config: SwitchBenchConfig) -> dict[str, Any]:
    keep = ("slots", "window", "duration_s", "warmup_s", "repeats")
    return {name: value for name, value in asdict(config).items() if name in keep}


def _measure(config: SwitchBenchConfig, point: dict[str, Any], address: str, cores: list[int]) -> dict[str, Any]:
    k = point["payload_bytes"] // 4
    datagram = p.HEADER_BYTES + point["payload_bytes"]
    window = config.window or max(1, min(config.slots, WINDOW_BYTES // datagram))
    addresses = [(host, int(port)) for host, _, port in (a.rpartition(":") for a in address.split(","))]
    before_cores = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    if before_cores is not None and cores:
        os.sched_setaffinity(0, cores)
    try:
        with Generator(addresses, point["world"], k, config.slots, window, random.randrange(1, 2**31),
                       offload=point["offload"]) as generator:
            generator.join()
            generator.run(config.warmup_s)
            start = probe(address)
            counts = generator.run(config.duration_s, point["rate_pps"] or None)
            end = probe(address)
    finally:
        if before_cores is not None:
            os.sched_setaffinity(0, before_cores)
    seconds = counts.seconds
    # less the counters requests themselves: the last one is counted in, the first one's answer out
    rx, tx = end["rx"] - start["rx"] - len(addresses), end["tx"] - start["tx"] - len(addresses)
    cpu_s = (end["cpu_us"] - start["cpu_us"]) * 1e-6 if "cpu_us" in end else None  # older switches: not said
    return {"switch_data_path": "c" if end.get("fast_path") else "numpy", "generator_data_path": generator.path,
            "in_packets": rx, "out_packets": tx, "sent": counts.sent, "results": counts.results,
            "seconds": seconds, "in_pps": rx / seconds, "out_pps": tx / seconds, "total_pps": (rx + tx) / seconds,
            "total_GBps": (rx + tx) * datagram / seconds / 1e9, "switch_cpu_s": cpu_s,
            "switch_cores": cpu_s / seconds if cpu_s is not None else None,
            "total_pps_per_core": (rx + tx) / cpu_s if cpu_s else None,
            "tx_dropped": end["tx_dropped"] - start["tx_dropped"], "bad": end["bad"] - start["bad"],
            "wrong": counts.wrong, "stalled": int(counts.stalled)}


def _medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the median over repeats (counts: summed), and the repeats' total rates."""
    out: dict[str, Any] = {}
    for name in samples[0]:
        values = [s[name] for s in samples if s[name] is not None]
        if name.endswith("data_path"):
            out[name] = "+".join(sorted(set(values)))
        elif name in ("wrong", "stalled", "tx_dropped", "bad"):
            out[name] = sum(values)
        else:
            out[name] = statistics.median(values) if values else None
    out["total_pps_repeats"] = [round(s["total_pps"]) for s in samples]
    return out
