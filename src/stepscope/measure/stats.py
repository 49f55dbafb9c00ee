"""Summary statistics of repeated timings (pure Python + numpy; no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Stats:
    """Statistics of n samples, in the samples' unit (stepscope times are seconds)."""

    n: int
    mean: float
    std: float
    """Sample standard deviation (n - 1 in the denominator; 0 for one sample)."""
    median: float
    min: float
    max: float
    p10: float
    p90: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if len(samples) == 0:
            raise ValueError("no samples")
        x = np.asarray(samples, dtype=np.float64)
        return cls(n=len(x), mean=float(x.mean()), std=float(x.std(ddof=1)) if len(x) > 1 else 0.0,
                   median=float(np.median(x)), min=float(x.min()), max=float(x.max()),
                   p10=float(np.percentile(x, 10)), p90=float(np.percentile(x, 90)))

    def scaled(self, factor: float) -> Stats:
        """The same statistics in another unit (e.g. factor 1e3 for seconds -> milliseconds)."""
        return Stats(self.n, *(v * factor for v in (self.mean, self.std, self.median, self.min, self.max,
                                                      self.p10, self.p90)))

    def metrics(self, prefix: str, unit: str = "ms", factor: float = 1e3) -> dict[str, float]:
        """Flat record metrics such as `forward_ms_median` (from seconds, scaled to `unit`)."""
        scaled = asdict(self.scaled(factor))
        n = scaled.pop("n")
        out = {f"{prefix}_{unit}_{name}": value for name, value in scaled.items()}
        out[f"{prefix}_n"] = n
        return out
