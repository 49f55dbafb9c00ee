"""Measurement (torch): timer and statistics, devices, GEMM yardstick, the phased training step,
the step benchmark, precision experiments. Import submodules directly, e.g.
`from stepscope.measure.step.benchmark import StepConfig, benchmark_step`."""
