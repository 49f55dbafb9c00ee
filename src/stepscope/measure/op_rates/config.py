"""The settings of `stepscope op-rates` (`OpRatesConfig`): which ops, against which system, how long. Torch-free,
so the command line reads its defaults without importing torch; `ops()` and `check()` refuse a bad layout."""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.errors import UsageError
from stepscope.measure.op_rates.shapes import MatrixOp, attention_ops, cube_op, dense_ops, layout_ops, moe_ops
from stepscope.spec.system import load_system


@dataclass(frozen=True)
class OpRatesConfig:
    """The ops to time (layouts of validated runs by default) and how."""

    dense: tuple[str, ...] = ("llama3-8b:1:8192", "llama3-70b:4:4096", "llama3-405b:8:8192")
    """model:tp:tokens per GPU: the GEMMs of one layer and of the output layer. The defaults are validated runs':
    Llama 3 8B at 8K tokens without TP or CP (torchtitan's, Megatron-Bridge's), 70B as dgxc-benchmarking runs it
    (TP 4, CP 2: 4,096), 405B as Meta trained it (TP 8, sequence parallel: the GEMMs see the gathered sequence)."""
    cubes: tuple[int, ...] = (1024, 1448, 2048, 2896, 4096, 5792, 8192)
    """n of n x n x n products: the efficiency curve below the model shapes (products under ~20 µs, e.g. 1024³,
    time the launch rather than the GPU)."""
    moe: tuple[str, ...] = ("qwen3-30b-a3b:16:4096", "deepseek-v3-gqa:64:4096", "mixtral-8x7b:8:4096")
    """model:ep:tokens per GPU: one GPU's expert GEMMs, balanced."""
    sdpa: tuple[str, ...] = ("llama3-8b:1:8192", "llama3-70b:4:8192", "llama3-405b:8:8192")
    """model:tp:seq: causal attention of one layer's local heads, per scaled-dot-product backend."""
    system: str = "H100-SXM"
    """The system preset or TOML whose modelled rates stand beside the measured ones."""
    rounds: int = 3
    """Rounds over every op (the median of each op's rounds)."""
    min_batch_s: float = 0.05
    """The shortest timed batch of back-to-back calls of one op."""
    preheat_s: float = 5.0
    """Seconds of large products first, so the GPU runs at its power-limited clock (sustained, not burst)."""
    device: str = "auto"
    """auto, cpu or cuda."""

    def ops(self) -> list[MatrixOp]:
        """Every op of the layouts, in order (UsageError naming a bad layout)."""
        return ([op for layout in self.dense for op in layout_ops(layout, dense_ops, "dense")]
                + [cube_op(n) for n in self.cubes]
                + [op for layout in self.moe for op in layout_ops(layout, moe_ops, "moe")]
                + [op for layout in self.sdpa for op in layout_ops(layout, attention_ops, "sdpa")])

    def check(self) -> list[MatrixOp]:
        """Refuse bad settings before any work; returns the ops."""
        if self.rounds < 1 or not self.min_batch_s > 0 or not self.preheat_s >= 0:
            raise UsageError(f"need rounds >= 1, min_batch_s > 0 and preheat_s >= 0, got rounds={self.rounds} "
                             f"min_batch_s={self.min_batch_s} preheat_s={self.preheat_s}")
        if any(n < 1 for n in self.cubes):
            raise UsageError(f"cube sizes must be positive, got {self.cubes}")
        load_system(self.system)
        ops = self.ops()
        if not ops:
            raise UsageError("no ops to time: give at least one of --dense, --cubes, --moe, --sdpa")
        return ops
