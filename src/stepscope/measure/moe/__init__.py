"""`stepscope step --vs-dense`: an MoE model's step beside the dense model of equal activated FLOPs, and its MoE block
piece by piece (router, permute, expert GEMMs, combine). `config` holds the point (`MoEDenseConfig`, torch-free),
`pieces` builds the timed candidates, `benchmark` times them side by side and writes `moe-vs-dense` records
(`run_moe_vs_dense`)."""
