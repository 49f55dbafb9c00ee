"""Many datagrams per system call: `recvmmsg` / `sendmmsg` through ctypes, straight into and out of preallocated
numpy buffers, with the kernel's UDP segmentation offloads on top.

Why: one `recvfrom` or `sendto` per datagram costs microseconds of Python and system-call overhead, which caps a
packet-at-a-time loop far below what the kernel can move. `recvmmsg` fills up to `messages` buffers per call and
`sendmmsg` sends a whole queue per call; nothing is copied into per-datagram `bytes` objects.

Segmentation offload (Linux >= 5.0; measured in docs/innet.md): with `UDP_SEGMENT` (GSO) one message carries up
to 64 datagrams of equal size (the last may be shorter) to one peer; the kernel cuts them apart (on a NIC:
the hardware; on loopback: the receiving socket). A socket with `UDP_GRO` receives such a train as one message
and is told the segment size, so one receive returns up to 64 datagrams. Each datagram keeps its own UDP
header on the wire; peers without GRO receive them one by one, and a kernel without these options gets plain
datagrams (`Receiver.gro`, `Sender.gso` say what is in use). Where `recvmmsg` does not exist (not Linux), the
same classes loop over `recv_into` / `send`: slower, same results. With the C fast path (`fastpath`), the same
calls and the same cutting of trains run in C (`_fastpath.recv_batch` / `send_batch`) instead of numpy around
ctypes.

    receiver = Receiver(sock, sources=True)      # the switch: who sent each datagram
    batch = receiver.receive()                   # Datagrams: offsets and lengths in receiver.buffer
    sender = Sender(sock)                        # connected (a worker) or with `Sender.address` indices
    sender.add(pointers, lengths, destinations)  # addresses of datagrams in numpy buffers that outlive flush()
    sender.flush()
"""

from __future__ import annotations

import ctypes
import errno
import select
import socket
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.innet.wire import fastpath
from stepscope.innet.wire.mmsg import (
    CMSG_BYTES,
    IOVEC,
    LIBC,
    MAX_SEGMENTS,
    MAX_UDP_PAYLOAD,
    MMSGHDR,
    MSG_DONTWAIT,
    PAD,
    SOCKADDR_IN,
    SOL_UDP,
    UDP_GRO,
    UDP_SEGMENT,
    address_key,
    key_address,
    raise_errno,
    set_option,
    sockaddr,
)

__all__ = ["PAD", "MAX_SEGMENTS", "Datagrams", "Receiver", "Sender", "address_key", "key_address"]
GRO_SEGMENTS = 128
"""The most datagrams the kernel puts in one received message (UDP_MAX_SEGMENTS of newer kernels)."""

@dataclass
class Datagrams:
    """One receive call's datagrams: `buffer[offsets[i] : offsets[i] + lengths[i]]` (valid until the next call)."""

    buffer: np.ndarray
    """uint8, with PAD readable bytes after its end."""
    offsets: np.ndarray
    """int64 byte offsets of the datagrams, in arrival order."""
    lengths: np.ndarray
    """int64 lengths (a datagram cut short by a too-small buffer has length -1)."""
    sources: np.ndarray | None = None
    """uint64 `address_key` of each datagram's sender (receivers created with `sources=True`)."""

    def __len__(self) -> int:
        return len(self.offsets)

    def datagram(self, i: int) -> bytes:
        start = int(self.offsets[i])
        return bytes(self.buffer[start:start + max(int(self.lengths[i]), 0)])


class Receiver:
    """Preallocated buffers for `messages` messages of `message_bytes` each, filled by one recvmmsg call.
    `data_path`: 'c' or 'numpy' (None: the environment's choice, `fastpath`)."""

    def __init__(self, sock: socket.socket, messages: int = 64, message_bytes: int = 65_536, *,
                 sources: bool = False, gro: bool = True, data_path: str | None = None) -> None:
        self.sock, self.messages, self.message_bytes = sock, messages, message_bytes
        self.buffer = np.zeros(messages * message_bytes + PAD, np.uint8)
        self.gro = gro and LIBC is not None and set_option(sock, UDP_GRO)
        self.sources = sources
        self._bases = np.arange(messages, dtype=np.int64) * message_bytes
        self.native = fastpath.resolve(data_path) if LIBC is not None else None
        if self.native is not None:  # the C receive writes a batch's datagrams here (views handed out)
            self._offsets = np.zeros(messages * GRO_SEGMENTS, np.int64)
            self._lengths = np.zeros(messages * GRO_SEGMENTS, np.int64)
            self._sources = np.zeros(messages * GRO_SEGMENTS, np.uint64) if sources else None
        if LIBC is None:
            return
        self._iov = np.zeros(messages, IOVEC)
        self._iov["base"] = self.buffer.ctypes.data + self._bases
        self._iov["len"] = message_bytes
        self._msgs = np.zeros(messages, MMSGHDR)
        self._msgs["iov"] = self._iov.ctypes.data + np.arange(messages) * IOVEC.itemsize
        self._msgs["iovlen"] = 1
        self._control = np.zeros((messages, CMSG_BYTES), np.uint8)
        self._msgs["control"] = self._control.ctypes.data + np.arange(messages) * CMSG_BYTES
        self._names = np.zeros((messages, SOCKADDR_IN), np.uint8)
        if sources:
            self._msgs["name"] = self._names.ctypes.data + np.arange(messages) * SOCKADDR_IN

    def receive(self) -> Datagrams:
        """Whatever is queued now, up to `messages` messages (none: an empty batch); never blocks.
        ConnectionRefusedError when a connected peer's port is closed."""
        if LIBC is None:
            return self._receive_one_by_one()
        if self.native is not None:
            count = self.native.recv_batch(self.sock.fileno(), self.buffer, self.messages, self.message_bytes, self.gro,
                                           self._offsets, self._lengths, self._sources)
            if count < 0:
                raise_errno(-count)
            return Datagrams(self.buffer, self._offsets[:count], self._lengths[:count],
                             None if self._sources is None else self._sources[:count])
        msgs = self._msgs
        msgs["controllen"] = CMSG_BYTES if self.gro else 0  # the kernel overwrites both per call
        if self.sources:
            msgs["namelen"] = SOCKADDR_IN
        count = LIBC.recvmmsg(self.sock.fileno(), msgs.ctypes.data, self.messages, MSG_DONTWAIT, None)
        if count < 0:
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                count = 0
            else:
                raise_errno(code)
        got = msgs[:count]
        lengths = got["len"].astype(np.int64)
        segment = lengths.copy()
        if self.gro and count:
            control = self._control[:count]
            has = (got["controllen"] >= 20) & (control[:, 8:12].view("<i4")[:, 0] == SOL_UDP) & (
                control[:, 12:16].view("<i4")[:, 0] == UDP_GRO)
            sizes = control[:, 16:20].view("<i4")[:, 0].astype(np.int64)
            segment = np.where(has & (sizes > 0), np.minimum(sizes, np.maximum(lengths, 1)), lengths)
        segment = np.maximum(segment, 1)
        per_message = np.maximum(-(-lengths // segment), 1)  # an empty datagram is still one datagram
        message = np.repeat(np.arange(count), per_message)
        first = np.cumsum(per_message) - per_message
        index = np.arange(len(message)) - first[message]
        offsets = self._bases[message] + index * segment[message]
        sizes = np.minimum(segment[message], lengths[message] - index * segment[message])
        truncated = (got["flags"] & 0x20) != 0  # MSG_TRUNC: the buffer was too small
        sizes[truncated[message]] = -1
        sources = None
        if self.sources:
            names = self._names[:count]
            keys = (names[:, 4:8].astype(np.uint64) << np.array([40, 32, 24, 16], np.uint64)).sum(axis=1) | (
                (names[:, 2].astype(np.uint64) << np.uint64(8)) | names[:, 3])
            sources = keys[message]
        return Datagrams(self.buffer, offsets, sizes, sources)

    def _receive_one_by_one(self) -> Datagrams:
        offsets, lengths, sources = [], [], []
        view = memoryview(self.buffer)
        for i in range(self.messages):
            base = i * self.message_bytes
            try:
                size, address = self.sock.recvfrom_into(view[base:base + self.message_bytes], self.message_bytes,
                                                        socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            offsets.append(base)
            lengths.append(size)
            sources.append(address_key(*address[:2]) if self.sources else 0)
        return Datagrams(self.buffer, np.array(offsets, np.int64), np.array(lengths, np.int64),
                         np.array(sources, np.uint64) if self.sources else None)


class Sender:
    """A queue of datagrams (addresses in buffers that stay alive until `flush`) sent by sendmmsg calls, trains
    of equal-size datagrams to one peer as one GSO message. `data_path`: as `Receiver`'s."""

    def __init__(self, sock: socket.socket, capacity: int = 8192, *, gso: bool = True,
                 data_path: str | None = None) -> None:
        self.sock = sock
        self.gso = gso and LIBC is not None
        self.native = fastpath.resolve(data_path) if LIBC is not None else None
        self.capacity = capacity
        self._ptr = np.zeros(capacity, np.uint64)
        self._len = np.zeros(capacity, np.int64)
        self._dest = np.zeros(capacity, np.int64)
        self._n = 0
        self._keep: list[Any] = []  # bytes queued by `add_bytes`, alive until sent
        self._book: dict[int, int] = {}  # address key -> row of `_names`
        self._names = np.zeros((16, SOCKADDR_IN), np.uint8)
        if LIBC is not None:
            self._iov = np.zeros(capacity, IOVEC)
            self._msgs = np.zeros(capacity, MMSGHDR)
            self._control = np.zeros((capacity, CMSG_BYTES), np.uint8)
            header = np.frombuffer(struct.pack("<Qii", 18, SOL_UDP, UDP_SEGMENT), np.uint8)  # CMSG_LEN(2)
            self._control[:, :16] = header
        self.sent = 0
        self.dropped = 0

    def __len__(self) -> int:
        return self._n

    def address(self, key: int) -> int:
        """The destination index of an address key (-1 sends on the connected socket)."""
        index = self._book.get(key)
        if index is None:
            index = self._book[key] = len(self._book)
            if index >= len(self._names):
                self._names = np.concatenate([self._names, np.zeros_like(self._names)])
            self._names[index] = np.frombuffer(sockaddr(key), np.uint8)
        return index

    def add(self, pointers: np.ndarray, lengths: np.ndarray, destinations: np.ndarray | int = -1) -> None:
        """Queue datagrams at `pointers` (bytes `lengths`) for `destinations` (indices from `address`)."""
        count = len(pointers)
        if self._n + count > self.capacity:
            self.flush()
            if count > self.capacity:  # more than a queue holds: in pieces
                for start in range(0, count, self.capacity):
                    piece = slice(start, start + self.capacity)
                    dests = destinations if np.isscalar(destinations) else destinations[piece]
                    self.add(pointers[piece], lengths[piece], dests)
                return
        end = self._n + count
        self._ptr[self._n:end] = pointers
        self._len[self._n:end] = lengths
        self._dest[self._n:end] = destinations
        self._n = end

    def keep(self, objects: list[Any]) -> None:
        """Keep `objects` (the buffers queued datagrams point into) alive until the next flush."""
        self._keep.extend(objects)

    def add_bytes(self, data: bytes, destination: int = -1) -> None:
        """Queue one datagram held in a bytes object (a reply built by hand)."""
        array = np.frombuffer(data, np.uint8)
        self._keep.append(array)
        self.add(np.array([array.ctypes.data], np.uint64), np.array([len(data)]), destination)

    def flush(self) -> int:
        """Send everything queued; returns the datagrams sent. A datagram the kernel will not take now (a full
        socket buffer) is dropped and counted, as a switch or NIC drops it: the protocol retransmits."""
        count, self._n = self._n, 0
        if not count:
            return 0
        try:
            if LIBC is None:
                return self._send_one_by_one(count)
            return self._send(count)
        finally:
            self._keep.clear()

    def _send(self, count: int) -> int:
        if self.native is not None:
            sent, dropped, gso, code = self.native.send_batch(self.sock.fileno(), self._ptr, self._len, self._dest,
                                                              count, self._names, self.gso)
            self.gso, self.dropped = bool(gso), self.dropped + dropped
            if code:
                raise_errno(code)
            self.sent += sent
            return sent
        ptr, length, dest = self._ptr[:count], self._len[:count], self._dest[:count]
        if len(self._book) > 1 and (dest[1:] != dest[:-1]).any():  # several peers: each one's datagrams together
            order = np.argsort(dest.astype(np.int16) if len(self._book) < 2**15 else dest, kind="stable")  # radix
            ptr, length, dest = ptr[order], length[order], dest[order]
        starts, counts = self._trains(length, dest)
        iov = self._iov[:count]
        iov["base"] = ptr
        iov["len"] = length
        msgs = self._msgs[:len(starts)]
        msgs["iov"] = self._iov.ctypes.data + starts * IOVEC.itemsize
        msgs["iovlen"] = counts
        train = counts > 1
        msgs["control"] = np.where(train, self._control.ctypes.data + np.arange(len(starts)) * CMSG_BYTES, 0)
        msgs["controllen"] = np.where(train, CMSG_BYTES, 0)
        self._control[:len(starts), 16:18].view("<u2")[:, 0] = length[starts]
        to = dest[starts]
        msgs["name"] = np.where(to >= 0, self._names.ctypes.data + np.maximum(to, 0) * SOCKADDR_IN, 0)
        msgs["namelen"] = np.where(to >= 0, SOCKADDR_IN, 0)
        done, sent = 0, 0
        while done < len(starts):
            result = LIBC.sendmmsg(self.sock.fileno(), msgs[done:].ctypes.data, len(starts) - done, MSG_DONTWAIT)
            if result > 0:
                sent += int(counts[done:done + result].sum())
                done += result
                continue
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS) and select.select(
                    [], [self.sock], [], 0.001)[1]:
                continue  # room again after a moment
            if code in (errno.EINVAL, errno.EIO) and self.gso and train[done:].any():
                self.gso = False  # this path cannot segment (old kernel, small MTU): plain datagrams from now on
                rest = slice(int(starts[done]), count)
                left = count - rest.start
                self._ptr[:left], self._len[:left], self._dest[:left] = ptr[rest], length[rest], dest[rest]
                return sent + self._send(left)
            if code == errno.ECONNREFUSED:
                raise_errno(code)
            self.dropped += int(counts[done])  # this message cannot go now: dropped, the next ones are tried
            done += 1
        self.sent += sent
        return sent

    def _trains(self, length: np.ndarray, dest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start index and size of each message: runs of equal length to one peer, within GSO's limits."""
        count = len(length)
        if not self.gso or count == 1:
            return np.arange(count), np.ones(count, np.int64)
        new = np.ones(count, bool)
        new[1:] = (dest[1:] != dest[:-1]) | (length[1:] != length[:-1])
        run_start = np.flatnonzero(new)
        run = np.cumsum(new) - 1
        position = np.arange(count) - run_start[run]
        limit = np.clip(MAX_UDP_PAYLOAD // np.maximum(length[run_start], 1), 1, MAX_SEGMENTS)
        new |= position % limit[run] == 0
        starts = np.flatnonzero(new)
        return starts, np.diff(np.append(starts, count))

    def _send_one_by_one(self, count: int) -> int:
        names = {index: key for key, index in self._book.items()}
        sent = 0
        for pointer, size, to in zip(self._ptr[:count], self._len[:count], self._dest[:count], strict=True):
            data = ctypes.string_at(int(pointer), int(size))
            try:
                if to < 0:
                    self.sock.send(data)
                else:
                    self.sock.sendto(data, key_address(names[int(to)]))
                sent += 1
            except BlockingIOError:
                self.dropped += 1
        self.sent += sent
        return sent
