"""The plot of `stepscope trace`: one stacked bar per rank-step, its GPU step time split into the kernel categories
and idle time. Categories share the busy time in proportion to their kernel time (kernels on several streams can
run at once, so their summed time may exceed the busy time)."""

from __future__ import annotations

from pathlib import Path

from stepscope.measure.categories import CATEGORIES
from stepscope.traces.analyze import RankAnalysis


def plot_steps(ranks: list[RankAnalysis], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, stacks, idle = [], {c: [] for c in CATEGORIES}, []
    for rank in ranks:
        for window in rank.steps or [rank.total]:
            step = "all" if window.step is None else window.step
            labels.append(f"r{rank.rank}\ns{step}")
            total = sum(window.categories.values()) or 1.0
            busy = window.breakdown.busy_us / 1e3
            for category in CATEGORIES:
                stacks[category].append(busy * window.categories.get(category, 0.0) / total)
            idle.append(window.breakdown.idle_us / 1e3)
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(labels) + 2), 4.5))
    bottom = [0.0] * len(labels)
    colors = plt.get_cmap("tab10")
    for index, category in enumerate(CATEGORIES):
        values = stacks[category]
        if any(values):
            axes.bar(labels, values, bottom=bottom, label=category, color=colors(index))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes.bar(labels, idle, bottom=bottom, label="idle", color="lightgrey", hatch="//", edgecolor="grey")
    axes.set_ylabel("GPU step time (ms)")
    axes.set_title("where each rank-step's GPU time goes")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
