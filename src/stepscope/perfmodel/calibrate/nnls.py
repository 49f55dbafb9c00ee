"""Non-negative least squares (Lawson & Hanson 1974, the active-set algorithm), numpy only.

min ||A·x − b||₂ subject to x ≥ 0. Columns are scaled to unit norm first, because the calibration mixes
columns in seconds-per-FLOP, seconds-per-byte and seconds-per-kernel that differ by many orders.
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, *, max_iterations: int | None = None) -> np.ndarray:
    """The x ≥ 0 minimizing ||a·x − b||."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    norms = np.linalg.norm(a, axis=0)
    used = norms > 0
    scale = np.where(used, norms, 1.0)
    a = a / scale
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0)) * float(np.abs(b).max(initial=0.0)))
    iterations = 0
    limit = max_iterations or 30 * n + 30
    while iterations < limit:
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & used
        if not candidates.any() or gradient[candidates].max() <= tolerance:
            break
        j = int(np.argmax(np.where(candidates, gradient, -np.inf)))
        passive[j] = True
        while True:
            iterations += 1
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
            if iterations >= limit:
                break
    return x / scale
