"""Tracing what a program does beneath its API, with a system-level tracer.

- `strace`: find strace and prove it is permitted here, the command that runs a program under it (one file
  per thread), and the parser of those files into system calls with their thread, process and timing;
- `syscall_kinds`: what a system call is for (network send/receive, polling and synchronisation, memory,
  thread creation, other) and the bytes it moved or mapped;
- `windows`: the calls of each process inside marked time windows, tallied per kind (markers are failing
  `readlink` calls on a path that names the window, written by the traced program).

Used by `stepscope comm --tally syscalls` (`distributed.collectives.syscall_tally`). May import errors only.
"""
