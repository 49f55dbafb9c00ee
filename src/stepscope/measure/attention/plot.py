"""Plot attention records: time and peak memory against sequence length, one line per implementation.

One column of panels per setup (dtype, causal, batch, heads); one row per timed pass plus one for
memory (the larger of the forward and backward peaks). Colours tell implementations
apart, markers head dimensions; both axes are logarithmic, so a quadratic cost is a line of slope 2.
Only `ok` records are drawn: an implementation whose line stops early ran out of memory (or failed
its check) at the next length. Rendered to a file, no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_PASS_METRIC = {"fwd": "fwd_ms_median", "bwd": "bwd_ms_median", "fwd-bwd": "fwd_bwd_ms_median"}
_MARKERS = "os^Dv<>p*h"


def _setup(config: dict[str, Any]) -> tuple:
    return (config["dtype"], config["causal"], config["batch"], config["heads"])


def plot_attention(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write the PNG to `path` (its folder is created) and return the path."""
    # a bare Figure renders to files without pyplot: no window, and the caller's backend is left alone
    from matplotlib.figure import Figure

    ok = [r for r in records if r.get("status") == "ok" and r.get("kind") == "attention"]
    if not ok:
        raise ValueError("no ok attention records to plot")
    setups = sorted({_setup(r["config"]) for r in ok}, key=str)
    passes = [p for p in ("fwd", "bwd", "fwd-bwd") if any(_PASS_METRIC[p] in r["metrics"] for r in ok)]
    impls = list(dict.fromkeys(r["config"]["impl"] for r in ok))
    dims = sorted({r["config"]["dim"] for r in ok})
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}
    markers = {dim: _MARKERS[i % len(_MARKERS)] for i, dim in enumerate(dims)}
    rows = passes + ["memory"]
    width, height = max(6.4, 4.8 * len(setups)), 3.0 * len(rows)
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(len(rows), len(setups), squeeze=False, sharex="col")
    for col, setup in enumerate(setups):
        dtype, causal, batch, heads = setup
        for row, what in enumerate(rows):
            ax = axes[row][col]
            for impl in impls:
                for dim in dims:
                    points = sorted((r["config"]["seq"], _value(r["metrics"], what)) for r in ok
                                    if _setup(r["config"]) == setup and r["config"]["impl"] == impl
                                    and r["config"]["dim"] == dim and _value(r["metrics"], what) is not None)
                    if points:
                        xs, ys = zip(*points, strict=True)
                        ax.plot(xs, ys, color=colors[impl], marker=markers[dim], markersize=4, linewidth=1,
                                label=f"{impl} d={dim}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel("peak MiB" if what == "memory" else f"{what} ms (median)")
            if row == 0:
                ax.set_title(f"{dtype}{' causal' if causal else ''}, batch {batch}, heads {heads}", fontsize=10)
            if row == len(rows) - 1:
                ax.set_xlabel("sequence length")
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    columns = max(1, min(len(labels), int(width // 1.6)))
    legend_rows = -(-len(labels) // columns)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, (0.15 + 0.2 * legend_rows) / height, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _value(metrics: dict[str, Any], what: str) -> float | None:
    if what == "memory":  # the whole call's peak
        peaks = [metrics[k] for k in ("fwd_peak_MiB", "bwd_peak_MiB") if metrics.get(k) is not None]
        return max(peaks) if peaks else None
    return metrics.get(_PASS_METRIC[what])
