from __future__ import annotations

import numpy as np

from stepscope.traces import intervals


def _covered(starts, ends, grid):
    return np.any((grid[:, None] >= starts) & (grid[:, None] < ends), axis=1)


def test_merge_length_overlap_and_clip_match_a_brute_force_grid() -> None:
    rng = np.random.default_rng(0)
    a_s = rng.integers(0, 900, 40).astype(float)
    a_e = a_s + rng.integers(1, 60, 40)
    b_s = rng.integers(0, 900, 30).astype(float)
    b_e = b_s + rng.integers(1, 60, 30)
    grid = np.arange(0, 1000) + 0.5
    a, b = intervals.merge(a_s, a_e), intervals.merge(b_s, b_e)
    assert np.all(a[0][1:] > a[1][:-1])  # sorted and disjoint
    assert intervals.length(a) == _covered(a_s, a_e, grid).sum()
    assert intervals.overlap(a, b) == (_covered(a_s, a_e, grid) & _covered(b_s, b_e, grid)).sum()
    clipped = intervals.clip(a, 100, 400)
    assert intervals.length(clipped) == _covered(a_s, a_e, grid[100:400]).sum()


def test_touching_intervals_merge_and_do_not_overlap() -> None:
    a = intervals.merge(np.array([0.0, 10.0]), np.array([10.0, 20.0]))
    assert len(a[0]) == 1 and intervals.length(a) == 20
    assert intervals.overlap(intervals.merge(np.array([0.0]), np.array([10.0])),
                             intervals.merge(np.array([10.0]), np.array([20.0]))) == 0
    assert intervals.length(intervals.merge(np.zeros(0), np.zeros(0))) == 0
