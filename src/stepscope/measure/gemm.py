"""The GEMM rate of this host: the yardstick a CPU step is compared with (fraction of GEMM rate).

A square matrix multiply in the step's dtype and thread count, sized up (256 .. 2048) until one call
takes long enough to time well; the median rate over about half a second of calls. Measured once per
host / device / dtype / threads / torch version and cached in `$STEPSCOPE_CACHE` (default
`~/.cache/stepscope/gemm.json`), because it costs a second or two.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from stepscope.measure.device import device_name, dtype_of
from stepscope.measure.timer import time_callable
from stepscope.results.environment import base_environment

_MIN_CALL_S = 0.05
_BUDGET_S = 0.5
_SIZES = (256, 512, 1024, 2048)


def cache_file() -> Path:
    """Where measured GEMM rates are kept between runs."""
    root = os.environ.get("STEPSCOPE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "stepscope")
    return Path(root) / "gemm.json"


def measure_gemm_rate(precision: str, device: torch.device) -> tuple[float, int]:
    """(FLOP/s, n) of an n x n x n matmul: 2·n³ FLOPs per call, median over repeated calls."""
    dtype = dtype_of(precision)
    for n in _SIZES:
        operands = (torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype))
        # one untimed call (allocations, kernel selection), then one to size the problem
        call_s = time_callable(lambda pair=operands: torch.matmul(*pair), warmup=1, iters=1, device=device)[0]
        if call_s >= _MIN_CALL_S:
            break
    iters = max(3, round(_BUDGET_S / max(call_s, 1e-6)))
    samples = time_callable(lambda: torch.matmul(*operands), warmup=0, iters=iters, device=device)
    return 2.0 * n**3 / statistics.median(samples), n


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
    if not isinstance(cache, dict):  # a foreign or damaged file is replaced, never trusted
        cache = {}
    entry = cache.get(key)
    if not refresh and isinstance(entry, dict) and isinstance(entry.get("flops_per_s"), (int, float)):
        return float(entry["flops_per_s"])
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
