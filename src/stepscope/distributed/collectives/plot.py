"""PNG of a collective sweep: per op, bus bandwidth vs size (left) and time per call vs size (right,
log-log: small sizes are latency-bound, so this is where they can be read), one line per backend,
world size, mode, placement (and reduction, when not sum; skew for all_to_allv). Fitted α–β curves are drawn dashed when
present. matplotlib Agg only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.alpha_beta import headline_time_us


def _series_key(config: dict[str, Any]) -> tuple:
    return (config["backend"], config["world_size"], config["mode"], bool(config.get("in_place")), config["dtype"],
            config.get("redop"), config.get("skew"))


def _label(key: tuple) -> str:
    backend, world, mode, in_place, dtype, redop, skew = key
    return (f"{backend} n={world} {mode} {'in' if in_place else 'out'} {dtype}" + (f" {redop}" if redop else "")
            + (f" skew {skew:g}" if skew is not None else ""))


def plot_comm(records: Iterable[dict[str, Any]], path: str | Path, title: str | None = None) -> Path | None:
    """Write the figure to `path`; None (no file) when there is no measured point with a size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: OrderedDict[str, OrderedDict[tuple, list[tuple[int, float, float | None]]]] = OrderedDict()
    fits: dict[tuple, dict[str, Any]] = {}
    for record in records:
        config, metrics = record.get("config", {}), record.get("metrics", {})
        if record.get("kind") != "comm":
            continue
        if config.get("record") == "fit":
            fits[(config["op"],) + _series_key(config)] = record
            continue
        time_us = headline_time_us(metrics)
        if record.get("status") not in ("ok", "mismatch") or not config.get("size_bytes") or time_us is None:
            continue
        series = points.setdefault(config["op"], OrderedDict()).setdefault(_series_key(config), [])
        series.append((config["size_bytes"], time_us, metrics.get("busbw_GBps")))
    if not points:
        return None
    figure, axes = plt.subplots(len(points), 2, figsize=(12, 3.6 * len(points)), squeeze=False)
    for row, (op, by_series) in enumerate(points.items()):
        left, right = axes[row]
        for key, values in by_series.items():
            values.sort()
            sizes = [v[0] for v in values]
            line, = left.plot(sizes, [v[2] or 0.0 for v in values], marker="o", label=_label(key))
            right.plot(sizes, [v[1] for v in values], marker="o", color=line.get_color())
            fit = fits.get((op,) + key)
            if fit is not None and fit["metrics"].get("beta_GBps"):
                _draw_fit(right, fit["metrics"], sizes, line.get_color())
        left.set(xscale="log", xlabel="size S (bytes)", ylabel="busbw (GB/s)", title=f"{op}: bus bandwidth")
        fitted = any((op,) + key in fits for key in by_series)
        right.set(xscale="log", yscale="log", xlabel="size S (bytes)", ylabel="time per call (us, max over ranks)",
                  title=f"{op}: latency" + (" (dashed: α–β fit)" if fitted else ""))
        for axis in (left, right):
            axis.grid(True, which="both", alpha=0.3)
        left.legend(fontsize=7)
    height = 3.6 * len(points)
    if title:
        figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.35 / height) if title else None)  # room for the suptitle
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _draw_fit(axis: Any, metrics: dict[str, Any], sizes: list[int], color: str) -> None:
    import numpy as np

    grid = np.geomspace(min(sizes), max(sizes), 50)
    model = metrics["alpha_us"] + metrics["bus_factor"] * grid / (metrics["beta_GBps"] * 1e3)
    axis.plot(grid, model, linestyle="--", linewidth=1, color=color)
