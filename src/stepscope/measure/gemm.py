"""The GEMM rate of this host: the yardstick a CPU step is compared with (fraction of GEMM rate).

A square matrix multiply in the step's dtype and thread count, sized up (256 .. 2048) until one call
takes long enough to time well; the median rate over about half a second of calls. Measured once per
host / device / dtype / threads / torch version and cached in `$STEPSCOPE_CACHE` (default
`~/.cache/stepscope/gemm.json`), because it costs a second or two.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from stepscope.measure.device import device_name, dtype_of, synchronize
from stepscope.results.environment import base_environment

_MIN_CALL_S = 0.05
_BUDGET_S = 0.5
_SIZES = (256, 512, 1024, 2048)


def cache_file() -> Path:
    root = os.environ.get("STEPSCOPE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "stepscope")
    return Path(root) / "gemm.json"


def measure_gemm_rate(precision: str, device: torch.device) -> tuple[float, int]:
    """(FLOP/s, n) of an n x n x n matmul: 2·n³ FLOPs per call, median over repeated calls."""
    dtype = dtype_of(precision)
    for n in _SIZES:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.matmul(a, b)  # warm-up (allocations, kernel selection)
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        if time.perf_counter() - start >= _MIN_CALL_S:
            break
    samples = []
    deadline = time.perf_counter() + _BUDGET_S
    while len(samples) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return 2.0 * n**3 / samples[len(samples) // 2], n


def gemm_rate(precision: str, device: torch.device | str = "cpu", *, refresh: bool = False) -> float:
    """Cached GEMM FLOP/s for this host, device, precision and the current thread count."""
    device = torch.device(device)
    env = base_environment()
    key = "|".join([env["hostname"], device_name(device), precision, str(torch.get_num_threads()),
                    torch.__version__])
    path = cache_file()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if not refresh and key in cache:
        return float(cache[key]["flops_per_s"])
    rate, n = measure_gemm_rate(precision, device)
    cache[key] = {"flops_per_s": rate, "n": n, "utc_time": env["utc_time"]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)  # atomic: concurrent ranks never see half a file
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return rate
