"""`stepscope profile`: where a training step's time goes. `benchmark` runs the step under torch.profiler,
`events` attributes the profiler's events to phases and categories, `tables` and `attention_pieces` make the
tables a point prints and records."""

from stepscope.measure.profile.benchmark import ProfileConfig, ProfileResult, profile_step, run_profile_sweep

__all__ = ["ProfileConfig", "ProfileResult", "profile_step", "run_profile_sweep"]
