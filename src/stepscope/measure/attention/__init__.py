"""`stepscope attention`: every attention implementation checked against fp64 (`check`), its memory measured
(`memory`), then timed side by side (`benchmark`); preset sweeps (`presets`) and the plot (`plot`)."""

from stepscope.measure.attention.benchmark import (
    AttentionBenchConfig,
    run_attention_sweep,
)

__all__ = ["AttentionBenchConfig", "run_attention_sweep"]
