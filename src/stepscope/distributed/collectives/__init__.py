"""The collective-communication benchmark behind `stepscope comm`, with nccl-tests conventions.

Read in this order: `ops` (the collectives, their buffer layouts, busbw factors and checkable values),
`splits` (all_to_allv's uneven split: a seeded Zipf token-per-expert popularity), `points` (what one
measurement is), `benchmark` (a request run per backend and world size), `rank` (what every rank does
per point, any backend), `torch_rank` / `mpi_rank` (the backends), `mpi_job` (mpiexec), `alpha_beta`
(fits), `report` / `plot` / `tally` (views), `syscall_tally` / `syscall_report` (`--tally syscalls`: the job
again under strace, through `distributed.tracing`, and its tables), `nccl_tests_format` (their logs, both ways),
`backends` (which backends can run here), `sizes` (`1K:16M:x4`).
"""
