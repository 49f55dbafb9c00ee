"""Fault injection for the emulator: packet drop, duplication and reordering on the worker's uplink
(worker -> switch) and downlink (switch -> worker), and straggling ranks.

Network faults are applied inside the worker, around its socket: an uplink drop never leaves the host, a
downlink drop is a datagram the worker discards on arrival, as if the network had lost it. Reordering holds
a datagram back and releases it after the next one (or after `reorder_hold_s`). Every decision comes from
a seeded generator, so a run can be repeated.

Stragglers: `StragglerSpec.parse("ranks=1;delay=20ms;prob=1;steps=3-5")` makes rank 1 sleep 20 ms before
steps 3 to 5 (the bench's ops, the training's backward passes). Rank -1 is the last rank of a world not
known yet (`innet train`'s default straggler): `for_world` names it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from stepscope.errors import UsageError


@dataclass(frozen=True)
class StragglerSpec:
    """Which ranks straggle, when, how likely and by how much."""

    ranks: tuple[int, ...] = (0,)
    """Ranks that may straggle (-1: the last rank, once `for_world` named it)."""
    delay_s: float = 0.0
    """How long a straggling rank sleeps before the step."""
    probability: float = 1.0
    """Chance that a listed rank straggles at a listed step."""
    steps: tuple[int, int] | None = None
    """Inclusive range of steps (0-based) where straggling may happen; None = every step."""

    @classmethod
    def parse(cls, text: str) -> StragglerSpec:
        """`ranks=1,2;delay=20ms;prob=0.5;steps=3-5` (delay in s, ms or us; steps N or A-B)."""
        fields: dict = {}
        for item in text.split(";"):
            name, sep, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not value:
                raise UsageError(f"malformed --straggler item {item!r} (expected name=value; see --help)")
            try:
                if name in ("rank", "ranks"):
                    fields["ranks"] = tuple(int(r) for r in value.split(","))
                elif name == "delay":
                    fields["delay_s"] = parse_duration(value)
                elif name in ("prob", "probability"):
                    fields["probability"] = float(value)
                elif name == "steps":
                    first, _, last = value.partition("-")
                    fields["steps"] = (int(first), int(last or first))
                else:
                    raise UsageError(f"unknown --straggler field {name!r} (ranks, delay, prob, steps)")
            except ValueError:
                raise UsageError(f"invalid --straggler value {value!r} for {name}") from None
        spec = cls(**fields)
        spec.validate()
        return spec

    def validate(self, world: int | None = None) -> None:
        """Without a world, rank -1 (the last) may stand; against a world, every rank must be one of it."""
        if not 0 <= self.delay_s < math.inf or not 0 <= self.probability <= 1:
            raise UsageError("--straggler needs a finite delay >= 0 and 0 <= prob <= 1")
        lowest = -1 if world is None else 0
        if any(r < lowest for r in self.ranks) or (world is not None and any(r >= world for r in self.ranks)):
            raise UsageError(f"--straggler ranks {list(self.ranks)} must be in 0..{(world or 1) - 1}")
        if self.steps is not None and (self.steps[0] < 0 or self.steps[1] < self.steps[0]):
            raise UsageError("--straggler steps must be N or A-B with 0 <= A <= B")

    def for_world(self, world: int) -> StragglerSpec:
        """This spec with rank -1 named as the last rank of `world`."""
        return replace(self, ranks=tuple(world - 1 if r == -1 else r for r in self.ranks))

    def delay_for(self, rank: int, step: int, rng: random.Random) -> float:
        """Seconds this rank sleeps before `step` (0 when it does not straggle)."""
        if rank not in self.ranks or self.delay_s == 0:
            return 0.0
        if self.steps is not None and not self.steps[0] <= step <= self.steps[1]:
            return 0.0
        return self.delay_s if rng.random() < self.probability else 0.0

    def describe(self) -> str:
        steps = "every step" if self.steps is None else f"steps {self.steps[0]}-{self.steps[1]}"
        return f"ranks {','.join(map(str, self.ranks))} +{self.delay_s * 1e3:g} ms, p={self.probability:g}, {steps}"


def parse_duration(text: str) -> float:
    """'20ms' -> 0.02, '1.5s' -> 1.5, '300us' -> 0.0003, '0.1' -> 0.1 (seconds)."""
    text = text.strip().lower()
    for suffix, factor in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@dataclass(frozen=True)
class FaultConfig:
    """Network faults injected around a worker's socket (probabilities per datagram)."""

    drop_up: float = 0.0
    """Chance a worker -> switch datagram is lost."""
    drop_down: float = 0.0
    """Chance a switch -> worker datagram is lost."""
    duplicate: float = 0.0
    """Chance a datagram (either direction) is delivered twice."""
    reorder: float = 0.0
    """Chance a datagram (either direction) is held back and delivered after the next one."""
    reorder_hold_s: float = 0.002
    """Longest time a held-back datagram waits for a successor."""
    seed: int = 0
    """Seed of the fault decisions (each rank adds its rank)."""
    straggler: StragglerSpec | None = None
    """Straggling ranks (applied by the caller before a step: bench op, training backward)."""

    def validate(self) -> None:
        for name in ("drop_up", "drop_down", "duplicate", "reorder"):
            value = getattr(self, name)
            top = 1 if name.startswith("drop") else 1 + 1e-12  # dropping everything could never finish
            if not 0 <= value < top:
                interval = "[0, 1)" if top == 1 else "[0, 1]"
                raise UsageError(f"--{name.replace('_', '-')} must be a probability in {interval}, got {value}")

    @property
    def network(self) -> bool:
        return any((self.drop_up, self.drop_down, self.duplicate, self.reorder))


@dataclass
class FaultCounters:
    """What the injector did (reported next to the switch counters)."""

    dropped_up: int = 0
    dropped_down: int = 0
    duplicated: int = 0
    reordered: int = 0


@dataclass
class _Direction:
    drop: float
    deliver: Callable[[bytes], None]
    held: bytes | None = None
    held_since: float = 0.0
    dropped: int = 0


class FaultInjector:
    """Wraps one worker's send and receive paths; `flush()` releases held datagrams that waited too long."""

    def __init__(self, config: FaultConfig, rank: int, send: Callable[[bytes], None],
                 receive: Callable[[bytes], None]) -> None:
        self.config = config
        self.rng = random.Random(config.seed * 1_000_003 + rank)
        self.counters = FaultCounters()
        self.up = _Direction(config.drop_up, send)
        self.down = _Direction(config.drop_down, receive)
        self._held_directions = (self.up, self.down)

    def send(self, packet: bytes) -> None:
        self._pass(self.up, packet)
        self.counters.dropped_up = self.up.dropped

    def receive(self, packet: bytes) -> None:
        self._pass(self.down, packet)
        self.counters.dropped_down = self.down.dropped

    def _pass(self, direction: _Direction, packet: bytes) -> None:
        rng, config = self.rng, self.config
        if direction.drop and rng.random() < direction.drop:
            direction.dropped += 1
            return
        copies = 2 if config.duplicate and rng.random() < config.duplicate else 1
        self.counters.duplicated += copies - 1
        held_now = direction.held is None and config.reorder and rng.random() < config.reorder
        if held_now:
            direction.held, direction.held_since = packet, time.monotonic()
            self.counters.reordered += 1
            copies -= 1
        for _ in range(copies):
            direction.deliver(packet)
        if direction.held is not None and not held_now:
            held, direction.held = direction.held, None
            direction.deliver(held)  # it now arrives after the datagram that followed it

    def next_release(self) -> float | None:
        """When the oldest held datagram must be released (for the caller's wait timeout)."""
        times = [d.held_since + self.config.reorder_hold_s for d in self._held_directions if d.held is not None]
        return min(times) if times else None

    def flush(self, now: float, force: bool = False) -> None:
        for direction in self._held_directions:
            if direction.held is not None and (force or now >= direction.held_since + self.config.reorder_hold_s):
                held, direction.held = direction.held, None
                direction.deliver(held)
