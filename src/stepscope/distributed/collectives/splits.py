"""How `all_to_allv` splits each rank's send buffer: a token-per-expert popularity with a skew,
deterministic from a seed, so every rank computes the same split matrix without communicating.

The model is expert-parallel dispatch. Each rank holds the same number of routed tokens (top-k copies
included) and sends each to the rank hosting its expert. Every rank therefore sends the same total,
and what differs is how much each rank receives: a rank whose experts are popular receives more.

- popularity: destination rank d gets the share p_d ∝ 1 / k_d^skew, where k_d = 1..n is d's popularity
  rank (Zipf's law with exponent `skew`). A seeded permutation decides which rank is hottest, so the
  hot rank is not always rank 0. skew 0 gives p_d = 1/n: the split of the equal all_to_all.
- split: every source rank divides its `send_count` elements by the same shares (a hot expert is hot
  for every rank's tokens), in whole elements by the largest-remainder method. The arithmetic is exact
  (fractions of the float weights), so skew 0 splits a multiple of n into exactly equal parts. Leftover
  elements go to the largest remainders, ties broken starting at a different destination per source.
- imbalance = the most elements any rank receives / the mean (= send_count, since the total received
  equals the total sent). The MoE literature's max/mean tokens per expert, at rank granularity; with n
  ranks it is about n * max(p).

`split_matrix(send_count, n, skew, seed)[src][dst]` is the number of elements rank src sends to dst.
"""

from __future__ import annotations

import random
from fractions import Fraction
from functools import lru_cache

SplitMatrix = tuple[tuple[int, ...], ...]
"""Elements rank src sends to rank dst, indexed [src][dst]."""


def popularity(world_size: int, skew: float, seed: int = 0) -> tuple[float, ...]:
    """Share of every rank's tokens that goes to each destination rank (sums to 1)."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    if skew < 0:
        raise ValueError("skew must be non-negative")
    order = list(range(world_size))
    random.Random(seed).shuffle(order)  # order[k] is the destination with popularity rank k + 1
    weights = [0.0] * world_size
    for k, destination in enumerate(order):
        weights[destination] = 1.0 / (k + 1) ** skew
    total = sum(weights)
    return tuple(w / total for w in weights)


def _apportion(total: int, weights: list[Fraction], first: int) -> list[int]:
    """`total` whole elements in proportion to `weights` (largest remainder; ties from index `first` on)."""
    scale = sum(weights)
    quotas = [total * w / scale for w in weights]
    counts = [int(q) for q in quotas]  # floor: quotas are non-negative
    n = len(weights)
    by_remainder = sorted(range(n), key=lambda d: (-(quotas[d] - counts[d]), (d - first) % n))
    for d in by_remainder[:total - sum(counts)]:
        counts[d] += 1
    return counts


@lru_cache(maxsize=256)
def split_matrix(send_count: int, world_size: int, skew: float, seed: int = 0) -> SplitMatrix:
    """Elements each rank sends to each rank: every row sums to `send_count` (see the module docstring)."""
    if send_count < 0:
        raise ValueError("send_count must be non-negative")
    weights = [Fraction(p) for p in popularity(world_size, skew, seed)]
    return tuple(tuple(_apportion(send_count, weights, source)) for source in range(world_size))


def received(splits: SplitMatrix, rank: int) -> tuple[int, ...]:
    """Elements `rank` receives from each source rank (column `rank`)."""
    return tuple(row[rank] for row in splits)


def displacements(counts: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Start offset of each block when blocks of `counts` elements are laid out back to back."""
    starts, at = [], 0
    for count in counts:
        starts.append(at)
        at += count
    return tuple(starts)


def imbalance(splits: SplitMatrix) -> float:
    """Most elements any rank receives / the mean received (1.0 for an equal split; 1.0 when empty)."""
    n = len(splits)
    totals = [sum(received(splits, rank)) for rank in range(n)]
    mean = sum(totals) / n if n else 0
    return max(totals) / mean if mean else 1.0
