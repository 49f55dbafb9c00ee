"""The memory timeline PNG: bytes live vs time, with init, forward, backward and optimizer phases shaded."""

from __future__ import annotations

from pathlib import Path

from stepscope.measure.allocations import AllocationTrace

PHASE_COLORS = {"init": "#9e9e9e", "forward": "#4c78a8", "backward": "#f58518", "optimizer": "#54a24b"}


def plot_timeline(trace: AllocationTrace, path: str | Path, *, title: str = "",
                  marker_s: float | None = None) -> Path:
    """Write the timeline of `trace` to `path` (PNG); `marker_s` draws a line where the measured step starts."""
    # a bare Figure renders to files without pyplot: no window, and the caller's backend is left alone
    from matplotlib.figure import Figure

    times, live = trace.timeline()
    mib = 2**20
    fig = Figure(figsize=(10, 4.5), dpi=110)
    ax = fig.subplots()
    shaded: set[str] = set()
    for name, start, end in trace.ranges:
        phase = name.removeprefix("stepscope.")
        if phase not in PHASE_COLORS:
            continue
        ax.axvspan(1e3 * start, 1e3 * end, color=PHASE_COLORS[phase], alpha=0.18, lw=0,
                   label=phase if phase not in shaded else None)
        shaded.add(phase)
    xs = [0.0] + [1e3 * t for t in times] + [1e3 * trace.duration_s]
    ys = [0.0] + [b / mib for b in live] + [(live[-1] if live else 0) / mib]
    ax.step(xs, ys, where="post", color="black", lw=1.2, label="allocated")
    if live:
        peak = max(range(len(live)), key=live.__getitem__)
        ax.plot([1e3 * times[peak]], [live[peak] / mib], "o", color="#d62728")
        ax.annotate(f"peak {live[peak] / mib:,.1f} MiB", (1e3 * times[peak], live[peak] / mib),
                    textcoords="offset points", xytext=(6, 4), fontsize=9, color="#d62728")
    if marker_s is not None:
        ax.axvline(1e3 * marker_s, color="#555555", ls="--", lw=1)
        ax.annotate("measured step", (1e3 * marker_s, 0), textcoords="offset points", xytext=(4, 6), fontsize=8,
                    color="#555555")
    ax.set_xlabel("time since tracking began (ms)")
    ax.set_ylabel(f"allocated on {trace.device} (MiB)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
