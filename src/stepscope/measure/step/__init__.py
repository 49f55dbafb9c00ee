"""`stepscope step`: a training step timed phase by phase (`benchmark`), and two setups side by side (`ab`)."""

from stepscope.measure.step.ab import StepABResult, benchmark_ab
from stepscope.measure.step.benchmark import StepConfig, StepResult, benchmark_step, run_step_sweep

__all__ = ["StepConfig", "StepResult", "benchmark_step", "run_step_sweep", "StepABResult", "benchmark_ab"]
