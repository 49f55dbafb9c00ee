"""The timing harness on functions of known duration, statistics, and the interleaved A/B mode."""

import time

import pytest

from stepscope.measure.stats import Stats
from stepscope.measure.timer import PhaseClock, interleaved, time_callable


def test_stats_of_known_samples():
    stats = Stats.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (stats.n, stats.mean, stats.median, stats.min, stats.max) == (5, 3.0, 3.0, 1.0, 5.0)
    assert stats.std == pytest.approx(1.5811388, rel=1e-6)
    assert stats.p10 == pytest.approx(1.4) and stats.p90 == pytest.approx(4.6)
    metrics = stats.metrics("forward")
    assert metrics["forward_ms_median"] == pytest.approx(3000.0) and metrics["forward_n"] == 5
    assert Stats.of([2.0]).std == 0.0
    with pytest.raises(ValueError):
        Stats.of([])


def test_time_callable_measures_a_sleep():
    calls = []
    start = time.perf_counter()
    samples = time_callable(lambda: (calls.append(1), time.sleep(0.02)), warmup=2, iters=5)
    elapsed = time.perf_counter() - start
    assert len(calls) == 7 and len(samples) == 5
    assert min(samples) >= 0.019  # a sleep never ends early
    # no clock bound that a loaded machine could break: the samples are disjoint parts of the whole call (not
    # cumulative, no warm-up inside), and the two warm-up sleeps lie outside them
    assert sum(samples) + 2 * 0.019 <= elapsed


def test_phase_clock_laps():
    clock = PhaseClock("cpu")
    clock.start()
    time.sleep(0.01)
    clock.lap("forward")
    time.sleep(0.03)
    clock.lap("backward")
    assert list(clock.laps) == ["forward", "backward"]
    # lower bounds only: a sleep never ends early, but a loaded machine may stretch either one
    assert clock.laps["forward"] >= 0.009 and clock.laps["backward"] >= 0.029


def test_interleaved_alternates_and_reports_ratio():
    order = []
    result = interleaved(lambda: (order.append("a"), time.sleep(0.002)),
                         lambda: (order.append("b"), time.sleep(0.03)), warmup=1, iters=6)
    assert order[2:6] == ["a", "b", "b", "a"]  # after warm-up: AB, then BA
    assert len(result.ratios) == 6 and result.a.n == result.b.n == 6
    assert result.median_ratio == pytest.approx(sorted(result.ratios)[2] / 2 + sorted(result.ratios)[3] / 2)
    assert result.b.min >= 0.029  # a sleep never ends early
    assert 0 < result.median_ratio < 1  # a (2 ms) is faster than b (30 ms): wide margins for a loaded machine
