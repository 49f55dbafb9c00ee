"""`stepscope step`: a training step timed phase by phase. `config` holds the point (`StepConfig`, torch-free),
`benchmark` times it and writes `step` records (`run_step_sweep`), `ab` times two setups side by side and writes
`step-ab` records (`run_step_ab`)."""
