"""Distributed execution, one subpackage per subsystem:

- `launch`: starting ranks (spawned here, or the current process under torchrun / an srun job step, or an
  mpiexec job), the one teardown every path uses, and the rank-count limit of a machine;
- `collectives`: the collective-communication benchmark (`stepscope comm`) with nccl-tests conventions,
  per backend (torch.distributed gloo/nccl/ccl, mpi4py), α–β fits, nccl-tests logs, per-backend tallies;
- `tracing`: strace beneath the API (per-thread system calls, their kinds, windows the traced ranks mark), for
  `comm --tally syscalls` and `innet bench --tally syscalls`;
- `data_parallel`: the DDP variants behind one interface, the sharded optimizer and their benchmark
  (`stepscope ddp`); the bucket planner they use is pure Python and lives in `stepscope.spec.buckets`.

May import: errors, host, spec, nn, measure (the timing harness, devices and the training step) and results;
never perfmodel or cli. Import the subpackages directly, e.g. `from stepscope.distributed.launch import launch`.
"""
