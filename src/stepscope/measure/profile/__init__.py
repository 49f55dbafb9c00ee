"""`stepscope profile`: where a training step's time goes. `config` holds the point (`ProfileConfig`, torch-free),
`benchmark` runs the step under torch.profiler and writes `profile` and `profile-*` records
(`run_profile_sweep`), `events` attributes the profiler's events to phases and categories, `tables` and
`attention_pieces` make the tables a point prints and records."""
