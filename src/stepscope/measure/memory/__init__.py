"""`stepscope memory`: bytes live and peak per phase of a training step (`benchmark`), the timeline (`plot`)."""

from stepscope.measure.memory.benchmark import MemoryConfig, MemoryResult, measure_memory, run_memory_sweep

__all__ = ["MemoryConfig", "MemoryResult", "measure_memory", "run_memory_sweep"]
