"""The timing harness every stepscope benchmark uses.

- `time_callable`: warm-up, then timed iterations of one callable, device-synchronized.
- `PhaseClock`: laps inside one iteration (forward | backward | optimizer), a sync at each lap.
- `interleaved_rounds`: the one N-way interleaved harness. Every candidate runs once per round and the
  order rotates each round (A B C, B C A, C A B, ...; for two: A B, B A, A B, ...), so drift and noise
  hit all alike. `step --ab`, `attention`, `ddp` and `innet bench` time their candidates through it,
  each with its own way of taking one sample (a whole step, laps, a barrier first, CPU time beside wall).
- `interleaved`: two callables through that harness, with every pair's ratio: the only kind of
  performance claim stepscope makes.

On CUDA the device is synchronized before every clock reading (CUDA events would hide host overhead
between phases, which is part of what users pay); on CPU the work is synchronous already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from stepscope.measure.device import synchronize
from stepscope.measure.stats import Stats

Label = TypeVar("Label", bound=Hashable)
Sample = TypeVar("Sample")


def rotation(labels: Sequence[Label], round_index: int) -> list[Label]:
    """The order of round `round_index`: `labels` rotated left by the round number."""
    if not labels:
        return []
    shift = round_index % len(labels)
    return [*labels[shift:], *labels[:shift]]


def interleaved_rounds(labels: Sequence[Label], run: Callable[[Label, int], Sample | None], *, warmup: int,
                       iters: int) -> dict[Label, list[Sample]]:
    """`warmup` untimed rounds, then `iters` timed ones; in each, `run(label, round_index)` once per label in
    the rotating order (the first warm-up round and the first timed round in the order given), returning one
    sample. A `run` that returns None drops its label from the later rounds (a candidate that failed: its
    samples so far stay). Returns the timed samples per label."""
    samples: dict[Label, list[Sample]] = {label: [] for label in labels}
    active = list(labels)
    for round_index in range(warmup + iters):
        order = rotation(active, round_index if round_index < warmup else round_index - warmup)
        for label in order:
            sample = run(label, round_index)
            if sample is None:
                active.remove(label)
            elif round_index >= warmup:
                samples[label].append(sample)
    return samples


def measure_call(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Seconds of one call of `fn`, the device synchronized before and after."""
    device = torch.device(device)
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_callable(fn: Callable[[], object], *, warmup: int = 5, iters: int = 10,
                  device: torch.device | str = "cpu") -> list[float]:
    """Seconds per call for `iters` calls of `fn` after `warmup` untimed calls."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    return [measure_call(fn, device) for _ in range(iters)]


class PhaseClock:
    """Per-phase wall time inside one iteration: `start()`, then `lap("forward")`, `lap("backward")`, ...
    A phase lapped twice in one iteration (micro-batches) adds up."""

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
    """Time `a` and `b` alternately through `interleaved_rounds` (A B, B A, A B, ...)."""
    calls = {"a": a, "b": b}
    samples = interleaved_rounds(["a", "b"], lambda label, _: measure_call(calls[label], device),
                                 warmup=warmup, iters=iters)
    ratios = [ta / tb for ta, tb in zip(samples["a"], samples["b"], strict=True)]
    return ABResult(a=Stats.of(samples["a"]), b=Stats.of(samples["b"]), ratios=ratios)
