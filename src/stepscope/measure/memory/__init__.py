"""`stepscope memory`: bytes live and peak per phase of a training step. `config` holds the point (`MemoryConfig`,
torch-free), `benchmark` measures it and writes `memory` and `memory-*` records (`run_memory_sweep`), `plot`
draws the timeline."""
