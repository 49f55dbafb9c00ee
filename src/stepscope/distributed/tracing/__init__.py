"""Tracing what a program does beneath its API, with a system-level tracer.

- `strace`: find strace and prove it is permitted here, the command that runs a program under it (one file
  per thread), and the parser of those files into system calls with their thread, process and timing;
- `syscall_kinds`: what a system call is for (network send/receive, polling and synchronisation, memory,
  thread creation, other) and the bytes it moved or mapped;
- `windows`: the calls of each process inside marked time windows, tallied per kind (markers are failing
  `readlink` calls on a path that names the window, written by the traced program);
- `tally`: a benchmark's library function run again under strace (the program `traced_job`, its config handed
  over as a JSON plan, `plan`), its windows tallied as `syscalls` records.

Used by `stepscope comm --tally syscalls` (`distributed.collectives.syscall_tally`) and `stepscope innet bench
--tally syscalls` (`innet.runs.syscall_tally`). Imports errors and results only (the traced function is named by
its caller and imported by the child program).
"""
