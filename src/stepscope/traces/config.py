"""What `stepscope trace` analyses and how: each default is defined once, here. No torch, no numpy."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.errors import UsageError


@dataclass(frozen=True)
class TraceConfig:
    """Trace files (or folders of them) of one job, one file per rank, and what to report."""

    paths: tuple[str, ...] = ()
    """`.json` / `.json.gz` files or folders holding them (one file per rank)."""
    top: int = 10
    """Rows of the top-kernels and top-CPU-ops tables."""
    show_ranks: int = 8
    """Ranks whose own rows the tables list: all up to this many, else this many slowest by median step time (the
    records hold every rank; a table of 128 ranks' rows is unread and costs more to print than to analyse)."""
    stream_above_MiB: float = 256.0
    """Files whose JSON text is larger than this are parsed as a stream (ijson): memory then grows with the number
    of kernels, not with the file. Smaller files are read whole with orjson, which is about twice as fast."""
    plot: str | None = None
    """PNG/SVG/PDF path of the stacked bar per rank-step, drawn only when asked (None or "": no plot; matplotlib
    costs more than the analysis of a 15 MB trace, and `stepscope report` plots the records)."""
    system: str | None = None
    """System preset or TOML whose peaks the roofline is measured against (None: the preset whose accelerator has
    the trace's device name, else the published peaks table)."""
    workers: int = 0
    """Worker processes that read and analyse the rank files in parallel, or decode the blocks of one large file (0:
    one per usable core, at most one per file; 1: everything in this process, one file after another)."""
    launch_bound_share: float = 0.5
    """A step is launch-bound when more than this share of its kernels took longer to launch on the CPU than to
    run on the GPU (the GPU then waits for the CPU)."""

    def __post_init__(self) -> None:
        if self.show_ranks < 1:
            raise UsageError(f"--show-ranks must be 1 or more, got {self.show_ranks}")
        if self.workers < 0:
            raise UsageError(f"--workers must be 0 (one per core) or more, got {self.workers}")
        if not 0.0 <= self.launch_bound_share < 1.0:  # 1 or more: no step could ever be launch-bound
            raise UsageError(f"--launch-bound-share must be at least 0 and below 1, got {self.launch_bound_share:g}")
