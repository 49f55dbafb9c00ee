"""`stepscope attention`: every attention implementation checked against fp64 (`check`), its memory measured
(`memory`), then timed side by side (`benchmark`, which writes the `attention` records and the plot); the points
(`config`, torch-free), preset sweeps (`presets`) and the plot (`plot`)."""
