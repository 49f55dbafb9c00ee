"""The timing harness every stepscope benchmark uses.

- `time_callable`: warm-up, then timed iterations of one callable, device-synchronized.
- `PhaseClock`: laps inside one iteration (forward | backward | optimizer), a sync at each lap.
- `interleaved`: two callables timed alternately (A B B A ...) so drift and noise hit both alike;
  reports every pair's ratio and the median ratio: the only kind of performance claim stepscope makes.

On CUDA the device is synchronized before every clock reading (CUDA events would hide host overhead
between phases, which is part of what users pay); on CPU the work is synchronous already.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from stepscope.measure.device import synchronize
from stepscope.measure.stats import Stats


def time_callable(fn: Callable[[], object], *, warmup: int = 5, iters: int = 10,
                  device: torch.device | str = "cpu") -> list[float]:
    """Seconds per call for `iters` calls of `fn` after `warmup` untimed calls."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return samples


class PhaseClock:
    """Per-phase wall time inside one iteration: `start()`, then `lap("forward")`, `lap("backward")`, ..."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.laps: dict[str, float] = {}
        self._last = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self.laps = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self._last
        self._last = now


@dataclass(frozen=True)
class ABResult:
    """Side-by-side timing of A and B: seconds per call of each, and each pair's ratio A/B."""

    a: Stats
    b: Stats
    ratios: list[float]

    @property
    def median_ratio(self) -> float:
        """Median of the per-pair ratios time(A)/time(B): < 1 means A is faster."""
        return float(np.median(self.ratios))


def interleaved(a: Callable[[], object], b: Callable[[], object], *, warmup: int = 3, iters: int = 10,
                device: torch.device | str = "cpu") -> ABResult:
    """Time `a` and `b` alternately; the order flips every pair (AB, BA, AB, ...) to cancel drift."""
    device = torch.device(device)

    def once(fn: Callable[[], object]) -> float:
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        return time.perf_counter() - start

    for _ in range(warmup):
        once(a)
        once(b)
    times_a, times_b = [], []
    for i in range(iters):
        if i % 2 == 0:
            times_a.append(once(a))
            times_b.append(once(b))
        else:
            times_b.append(once(b))
            times_a.append(once(a))
    ratios = [ta / tb for ta, tb in zip(times_a, times_b)]
    return ABResult(a=Stats.of(times_a), b=Stats.of(times_b), ratios=ratios)
