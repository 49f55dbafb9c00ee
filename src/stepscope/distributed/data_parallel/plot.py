"""PNG of `stepscope ddp`: step time vs bucket size, one panel per benchmark point (model, batch, seq,
threads). DDPBucketed and PyTorch DDP are lines over the caps (bars: p10-p90 over rounds); the
cap-independent variants and the compute-only step are horizontal lines; the vertical line is the
analytic b* = sqrt(s·w·alpha) from the all-reduce fit. "One bucket" is drawn at the gradient size.
matplotlib Agg only (files, never a window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stepscope.distributed.data_parallel.bench_config import MiB
from stepscope.distributed.data_parallel.bench_result import DDPBenchResult, model_label

_STYLES = {"naive": ":", "flat": "--", "individual": "-.", "compute": "-"}


def _cap_position(result: DDPBenchResult, cap_mb: float | None) -> float:
    return result.grad_bytes / MiB if cap_mb is None else cap_mb


def plot_bucket_sweep(results: Sequence[DDPBenchResult], path: str | Path) -> Path:
    """Write the figure to `path` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(results))
    rows = math.ceil(len(results) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(9.0 * columns, 4.6 * rows), squeeze=False)
    for panel, result in zip(axes.flat, results, strict=True):
        for variant, marker in (("bucketed", "o"), ("torch", "s")):
            points = sorted(((_cap_position(result, v.bucket_MiB), v) for v in result.variants
                             if v.variant == variant), key=lambda item: item[0])
            if not points:
                continue
            xs = [x for x, _ in points]
            medians = [v.step.median * 1e3 for _, v in points]
            errors = [[(v.step.median - v.step.p10) * 1e3 for _, v in points],
                      [(v.step.p90 - v.step.median) * 1e3 for _, v in points]]
            name = "DDPBucketed" if variant == "bucketed" else "torch DDP"
            panel.errorbar(xs, medians, yerr=errors, marker=marker, capsize=3, label=name)
        for variant in ("naive", "flat", "individual", "compute"):
            match = result.compute if variant == "compute" else next(
                (v for v in result.variants if v.variant == variant), None)
            if match is not None:
                label = "compute only (no communication)" if variant == "compute" else variant
                panel.axhline(match.step.median * 1e3, linestyle=_STYLES[variant], color="gray", linewidth=1,
                              label=label)
        bstar = result.bstar_bytes()
        if math.isfinite(bstar):
            panel.axvline(bstar / MiB, color="red", linewidth=1, label=f"b* = {bstar / MiB:.2g} MiB")
        config = result.config
        panel.set(xscale="log", xlabel="bucket cap (MiB)", ylabel="step time, median (ms)",
                  title=f"{model_label(config.model)} batch {config.batch} seq {config.seq}\n"
                        f"{result.world_size} ranks x {result.threads} thread(s), {result.backend}")
        panel.grid(True, which="both", alpha=0.3)
        panel.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for panel in list(axes.flat)[len(results):]:
        panel.set_visible(False)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
