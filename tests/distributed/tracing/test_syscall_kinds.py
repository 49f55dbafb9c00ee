"""Every system call family of the kinds table (`syscall_kinds`), classified from lines strace printed here with
the tally's own flags (-f -ff -ttt -T -y -qq -s 0) while real programs ran: a 2-rank gloo all-reduce of 1 MiB
(torch.distributed, CPU), a 2-rank Open MPI send/recv of 1 MiB over the TCP transport (`--mca btl self,tcp`) and
over shared memory with CMA single copy (`--mca btl self,sm --mca smsc cma`), and UDP datagrams (Python's
sendto/recvfrom/sendmsg/recvmsg and stepscope's batched sendmmsg/recvmmsg of 300, 301 and 302 bytes, once with
`-e abbrev=none`). Each line: the kind and the bytes it moved, read off the line by hand."""

from __future__ import annotations

import pytest

from stepscope.distributed.tracing.strace import parse_line
from stepscope.distributed.tracing.syscall_kinds import KINDS, moved_bytes, syscall_kind


def mmsg_entry(iov_len: int, msg_len: int) -> str:
    """One message of a sendmmsg/recvmmsg array as `strace -e abbrev=none -s 0` prints it."""
    return ('{msg_hdr={msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base=""..., iov_len=' + str(iov_len)
            + '}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, msg_len=' + str(msg_len) + '}')


RECORDED = [
    # (program, line, kind, bytes)
    # gloo: payload out with writev (48-byte header + 256 KiB), in with recvfrom; the TCPStore's read/write/sendto
    ("gloo", "1795843521.475967 writev(12<socket:[109517]>, [...], 2) = 262192 <0.000297>", "send", 262192),
    ("gloo", '1795843521.490402 recvfrom(12<socket:[109517]>, ""..., 262144, 0, NULL, NULL) = 262144 <0.000412>',
     "recv", 262144),
    ("gloo", "1795843521.480410 recvfrom(12<socket:[109517]>, 0x5594ccb7f9c8, 48, 0, NULL, NULL) = -1 EAGAIN "
             "(Resource temporarily unavailable) <0.000014>", "recv", 0),
    ("gloo", '1795843521.406229 read(18<socket:[109486]>, ""..., 4096) = 210 <0.000076>', "recv", 210),
    ("gloo", '1795843520.008877 write(17<socket:[109478]>, ""..., 4) = 4 <0.000092>', "send", 4),
    ("gloo", '1795843519.997019 sendto(17<socket:[109977]>, ""..., 40, MSG_NOSIGNAL, NULL, 0) = 40 <0.000309>',
     "send", 40),
    ("gloo", "1795843521.408613 recvmsg(23<socket:[109508]>, {msg_name={sa_family=AF_NETLINK, nl_pid=0, "
             "nl_groups=00000000}, msg_namelen=12, msg_iov=[...], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) "
             "= 2952 <0.000038>", "recv", 2952),
    # the same calls on a file and a pipe are no communication
    ("gloo", '1795843502.231472 read(3</usr/lib/x86_64-linux-gnu/libc.so.6>, ""..., 832) = 832 <0.000016>', "other",
     0),
    ("gloo", '1795843509.637698 write(7<pipe:[109372]>, ""..., 984) = 984 <0.000042>', "other", 0),
    ("gloo", "1795843502.263298 ioctl(3</root/.pyenv/versions/3.11.7/lib/python3.11/encodings/__pycache__/"
             "__init__.cpython-311.pyc>, TCGETS, 0x7ffde86d5720) = -1 ENOTTY (Inappropriate ioctl for device) "
             "<0.000017>", "other", 0),
    ("gloo", "1795843509.654551 poll([...], 2, -1)    = 1 ([...]) <14.230394>", "poll", 0),
    ("gloo", "1795843521.400684 epoll_wait(10<anon_inode:[eventpoll]>, [], 64, 10) = 0 <0.010118>", "poll", 0),
    ("gloo", "1795843519.994832 epoll_pwait(7<anon_inode:[eventpoll]>, [...], 1024, -1, NULL, 8) = 1 <0.010766>",
     "poll", 0),
    ("gloo", "1795843525.448125 futex(0x7f72f61ff990, FUTEX_WAIT_BITSET|FUTEX_CLOCK_REALTIME, 11420, NULL, "
             "FUTEX_BITSET_MATCH_ANY) = 0 <0.000279>", "sync", 0),
    ("gloo", "1795843521.496504 sched_yield()         = 0 <0.000124>", "sync", 0),
    ("gloo", "1795843502.223462 mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = "
             "0x7f73147b2000 <0.000041>", "memory", 8192),
    ("gloo", "1795843502.240311 munmap(0x7f73147a9000, 34547) = 0 <0.000045>", "memory", 0),
    ("gloo", "1795843525.448269 madvise(0x7f72f59ff000, 8368128, MADV_DONTNEED) = 0 <0.000024>", "memory", 0),
    ("gloo", "1795843502.240593 brk(0x55717e902000)   = 0x55717e902000 <0.000019>", "memory", 0),
    ("gloo", "1795843502.235692 mprotect(0x7f7314796000, 16384, PROT_READ) = 0 <0.000033>", "memory", 0),
    ("gloo", "1795843504.045532 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|"
             "CLONE_SYSVSEM|CLONE_SETTLS|CLONE_PARENT_SETTID|CLONE_CHILD_CLEARTID, child_tid=0x7f72f61ff990, "
             "parent_tid=0x7f72f61ff990, exit_signal=0, stack=0x7f72f59ff000, stack_size=0x7fff80, "
             "tls=0x7f72f61ff6c0} => {parent_tid=[11420]}, 88) = 11420 <0.000089>", "thread", 0),
    # Open MPI over TCP: readv/writev on the sockets
    ("mpi-tcp", "1795843542.711130 readv(14<socket:[110298]>, [...], 2) = 756792 <0.000161>", "recv", 756792),
    ("mpi-tcp", "1795843541.789037 writev(21<socket:[110225]>, [...], 2) = 187615 <0.000355>", "send", 187615),
    ("mpi-tcp", "1795843541.515852 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, "
                "child_tidptr=0x7f3df6301a10) = 11914 <0.000857>", "thread", 0),
    ("mpi-tcp", "1795843541.899456 mremap(0x7efce35a4000, 4096, 8192, MREMAP_MAYMOVE) = 0x7efce2a44000 <0.000050>",
     "memory", 8192),
    ("mpi-tcp", "1795843541.481756 pselect6(19, [16<socket:[110187]> 17<socket:[110188]> 18<pipe:[110189]>], NULL, "
                "NULL, {tv_sec=3600, tv_nsec=0}, NULL) = 1 (in [18], left {tv_sec=3598, tv_nsec=601165741}) "
                "<1.398847>", "poll", 0),
    ("mpi-tcp", "1795843542.097618 clock_nanosleep(CLOCK_REALTIME, 0, {tv_sec=0, tv_nsec=100000}, NULL) = 0 "
                "<0.000196>", "sync", 0),
    # Open MPI's CMA single copy: one process reads (or writes) the other's memory
    ("mpi-cma", "1795843541.039355 process_vm_readv(11890, [...], 1, [...], 1, 0) = 1048576 <0.000441>", "copy",
     1048576),
    ("mpi-cma", "1795843539.945269 process_vm_writev(11889, [...], 1, [...], 1, 0) = 8 <0.000031>", "copy", 8),
    # UDP datagrams
    ("udp", '1795843553.410844 sendto(3<socket:[111308]>, ""..., 100, 0, {sa_family=AF_INET, sin_port=htons(52802), '
            'sin_addr=inet_addr("127.0.0.1")}, 16) = 100 <0.000141>', "send", 100),
    ("udp", '1795843553.411088 recvfrom(4<socket:[111309]>, ""..., 2048, 0, {sa_family=AF_INET, '
            'sin_port=htons(37517), sin_addr=inet_addr("127.0.0.1")}, [16]) = 100 <0.000038>', "recv", 100),
    ("udp", '1795843553.411366 sendmsg(3<socket:[111308]>, {msg_name={sa_family=AF_INET, sin_port=htons(52802), '
            'sin_addr=inet_addr("127.0.0.1")}, msg_namelen=16, msg_iov=[...], msg_iovlen=1, msg_controllen=0, '
            'msg_flags=0}, 0) = 200 <0.000048>', "send", 200),
    ("udp", '1795843553.411499 recvmsg(4<socket:[111309]>, {msg_name={sa_family=AF_INET, sin_port=htons(37517), '
            'sin_addr=inet_addr("127.0.0.1")}, msg_namelen=16, msg_iov=[...], msg_iovlen=1, msg_controllen=0, '
            'msg_flags=0}, 0) = 200 <0.000032>', "recv", 200),
    # three datagrams per call: the return value counts messages, not bytes; the lengths only where printed
    ("udp", "1795843553.413093 sendmmsg(3<socket:[111308]>, [...], 3, MSG_DONTWAIT) = 3 <0.000061>", "send", 0),
    ("udp", "1795843553.464085 recvmmsg(4<socket:[111309]>, [...], 8, MSG_DONTWAIT, NULL) = 3 <0.000266>", "recv",
     0),
    ("udp", "1795843570.410187 sendmmsg(3<socket:[110518]>, [" + ", ".join(
        mmsg_entry(n, n) for n in (300, 301, 302))
     + "], 3, MSG_DONTWAIT) = 3 <0.000030>", "send", 903),
    ("udp", "1795843570.460913 recvmmsg(4<socket:[110519]>, [" + ", ".join(
        mmsg_entry(2048, n) for n in (300, 301, 302))
     + "], 8, MSG_DONTWAIT, NULL) = 3 <0.000026>", "recv", 903),
]


@pytest.mark.parametrize("program, line, kind, moved", RECORDED, ids=[f"{r[0]}-{i}" for i, r in enumerate(RECORDED)])
def test_recorded_line_kind_and_bytes(program, line, kind, moved):
    call = parse_line(line)
    assert call is not None, line
    assert syscall_kind(call) == kind
    assert moved_bytes(call, kind) == moved


def test_every_kind_and_every_communication_call_is_seen():
    """The recorded lines cover every kind, and every send, receive and copy call the table names that a program
    can make succeed (pread*/pwrite* on a socket fail with ESPIPE: the kernel refuses them)."""
    calls = [parse_line(line) for _, line, _, _ in RECORDED]
    assert {syscall_kind(c) for c in calls} == set(KINDS)
    seen = {c.name for c in calls}
    assert {"sendmsg", "sendto", "sendmmsg", "write", "writev", "recvmsg", "recvfrom", "recvmmsg", "read", "readv",
            "process_vm_readv", "process_vm_writev"} <= seen
