"""The system-call layer under `batch_io`: `recvmmsg` / `sendmmsg` from libc through ctypes, the C structures they
take as numpy record arrays (so a whole batch's headers, iovecs and control messages are filled at once), the
UDP segmentation-offload options, and IPv4 addresses as integers."""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
import sys
from typing import Any

import numpy as np

SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h: send with this cmsg (u16 segment size) to have the kernel segment
UDP_GRO = 104      # receive segment trains whole; a cmsg (int) gives the segment size
MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS of older kernels (newer allow 128)
MAX_UDP_PAYLOAD = 65_507  # one IPv4 packet: a GSO train's datagrams together
MSG_DONTWAIT = 0x40
PAD = 64  # bytes after a buffer's end: fixed-size reads of a short datagram's header never leave the buffer

MMSGHDR = np.dtype([("name", "<u8"), ("namelen", "<u4"), ("_p0", "<u4"), ("iov", "<u8"), ("iovlen", "<u8"),
                     ("control", "<u8"), ("controllen", "<u8"), ("flags", "<i4"), ("_p1", "<u4"),
                     ("len", "<u4"), ("_p2", "<u4")])  # struct mmsghdr on LP64 Linux (x86-64, arm64)
IOVEC = np.dtype([("base", "<u8"), ("len", "<u8")])
CMSG_BYTES = 24  # CMSG_SPACE(sizeof(u16)) == CMSG_SPACE(sizeof(int)) on LP64
SOCKADDR_IN = 16


def _libc() -> Any:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("recvmmsg", "sendmmsg"):
            function = getattr(libc, name)
            function.restype = ctypes.c_int
        libc.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


LIBC = _libc()
"""libc with recvmmsg/sendmmsg, or None (the classes fall back to one datagram per call)."""


def address_key(host: str, port: int) -> int:
    """An IPv4 address as one integer (address << 16 | port): compared for whole batches at once."""
    return (int.from_bytes(socket.inet_aton(host), "big") << 16) | port


def key_address(key: int) -> tuple[str, int]:
    return socket.inet_ntoa(int(key >> 16).to_bytes(4, "big")), int(key & 0xFFFF)


def sockaddr(key: int) -> bytes:
    host, port = key_address(key)
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(host) + bytes(8)


def raise_errno(code: int) -> None:
    if code == errno.ECONNREFUSED:
        raise ConnectionRefusedError(code, "Connection refused")
    raise OSError(code, errno.errorcode.get(code, "error"))


def set_option(sock: socket.socket, option: int) -> bool:
    """Switch a UDP option on; False where the kernel does not have it."""
    try:
        sock.setsockopt(SOL_UDP, option, 1)
        return True
    except OSError:
        return False
