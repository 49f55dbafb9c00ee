"""What a system call is for, in the kinds a communication backend's work splits into, and the bytes it moved.

| kind | calls |
|---|---|
| send | sendmsg, sendto, sendmmsg; write, writev, pwrite* on a socket |
| recv | recvmsg, recvfrom, recvmmsg; read, readv, pread* on a socket |
| copy | process_vm_readv / process_vm_writev: one process copying another's memory (Open MPI's CMA single copy) |
| poll | poll, ppoll, select, pselect6, epoll_wait, epoll_pwait, epoll_pwait2 |
| sync | futex, futex_waitv, sched_yield, nanosleep, clock_nanosleep |
| memory | mmap, munmap, mremap, brk, madvise, mprotect |
| thread | clone, clone3, fork, vfork (a thread or a process created) |
| other | the rest: file and pipe I/O, ioctl, timers, ... |

Bytes: what a send, receive or copy returned (bytes moved); what mmap and mremap mapped (their length).
sendmmsg and recvmmsg return a count of messages, not bytes: their bytes are the messages' `msg_len` where
strace printed them (`-e abbrev=none`), else unknown and not counted (the tally's `-s 0` prints the message
array as `[...]`: printing it whole would multiply the trace of a packet-rate run).
"""

from __future__ import annotations

import re

from stepscope.distributed.tracing.strace import Syscall

KINDS = ("send", "recv", "copy", "poll", "sync", "memory", "thread", "other")
_ALWAYS = {"sendmsg": "send", "sendto": "send", "sendmmsg": "send", "recvmsg": "recv", "recvfrom": "recv",
           "recvmmsg": "recv", "process_vm_readv": "copy", "process_vm_writev": "copy",
           "poll": "poll", "ppoll": "poll", "select": "poll", "pselect6": "poll", "epoll_wait": "poll",
           "epoll_pwait": "poll", "epoll_pwait2": "poll", "futex": "sync", "futex_waitv": "sync",
           "sched_yield": "sync", "nanosleep": "sync", "clock_nanosleep": "sync", "mmap": "memory",
           "munmap": "memory", "mremap": "memory", "brk": "memory", "madvise": "memory", "mprotect": "memory",
           "clone": "thread", "clone3": "thread", "fork": "thread", "vfork": "thread"}
_ON_SOCKET = {"write": "send", "writev": "send", "pwrite64": "send", "pwritev": "send", "pwritev2": "send",
              "read": "recv", "readv": "recv", "pread64": "recv", "preadv": "recv", "preadv2": "recv"}
_FD = re.compile(r"^\d+<(socket|TCP|TCPv6|UDP|UDPv6|UNIX|NETLINK)[:>\[]")
_MESSAGES = {"sendmmsg", "recvmmsg"}
_MESSAGE_LENGTH = re.compile(r"\bmsg_len=(\d+)")
_MAPPED_ARG = {"mmap": 1, "mremap": 2}
"""Which argument (0-based) holds the length a call maps."""


def syscall_kind(call: Syscall) -> str:
    """The kind of one call (see the module docstring)."""
    kind = _ALWAYS.get(call.name)
    if kind is not None:
        return kind
    if call.name in _ON_SOCKET and _FD.match(call.args):
        return _ON_SOCKET[call.name]
    return "other"


def moved_bytes(call: Syscall, kind: str) -> int:
    """Bytes a send, receive or copy moved, or a mapping call mapped (0 otherwise or when the call failed)."""
    if kind in ("send", "recv", "copy"):
        if call.ret is None or call.ret <= 0:
            return 0
        if call.name in _MESSAGES:  # a message count: the bytes are the printed message lengths, if any
            return sum(int(n) for n in _MESSAGE_LENGTH.findall(call.args))
        return call.ret
    index = _MAPPED_ARG.get(call.name)
    if index is None or call.error is not None:
        return 0
    parts = call.args.split(", ")
    try:
        return int(parts[index], 0)
    except (IndexError, ValueError):
        return 0
