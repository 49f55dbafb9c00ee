"""What the switch sends in answer to one batch: datagrams (an address and a length in a numpy buffer, or a bytes
object) with their destinations, each tagged with the index of the packet that caused it, so the batch's answers
go out in the order a packet-at-a-time switch would have sent them.

Destinations are indices of the switch's address book (`batch_io.Sender.address`). A buffer whose datagrams are
queued is kept alive here until the outbox is flushed (a job that leaves in the same batch frees nothing early).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Outbox:
    """Datagrams to send, collected while a batch is processed."""

    def __init__(self) -> None:
        self._order: list[np.ndarray] = []
        self._pointer: list[np.ndarray] = []
        self._length: list[np.ndarray] = []
        self._dest: list[np.ndarray] = []
        self._keep: list[Any] = []

    def __len__(self) -> int:
        return sum(len(part) for part in self._order)

    def add(self, order: np.ndarray, buffer: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
            dests: np.ndarray) -> None:
        """Datagrams at byte `offsets` of `buffer` (kept alive until sent), one destination each."""
        if not len(order):
            return
        self._keep.append(buffer)
        self._order.append(np.asarray(order, np.int64))
        self._pointer.append(buffer.ctypes.data + np.asarray(offsets, np.uint64))
        self._length.append(np.asarray(lengths, np.int64))
        self._dest.append(np.asarray(dests, np.int64))

    def add_bytes(self, order: int, data: bytes, dests: list[int]) -> None:
        """One datagram built by hand (a reply), to each of `dests`."""
        array = np.frombuffer(data, np.uint8)
        count = len(dests)
        self.add(np.full(count, order), array, np.zeros(count, np.int64), np.full(count, len(data)),
                 np.asarray(dests))

    def add_copies(self, order: np.ndarray, pointers: np.ndarray, lengths: np.ndarray, dests: np.ndarray) -> None:
        """Datagrams at memory addresses `pointers`, copied into a buffer of the outbox's own (a multicast's
        datagram, the same address and length several times, once)."""
        if not len(order):
            return
        import ctypes

        copied: dict[tuple[int, int], int] = {}
        for datagram in zip(pointers.tolist(), lengths.tolist(), strict=True):
            copied.setdefault(datagram, sum(n for _, n in copied))
        own = np.empty(sum(n for _, n in copied) + 1, np.uint8)
        for (p, n), o in copied.items():
            ctypes.memmove(own.ctypes.data + o, p, n)
        offsets = np.array([copied[d] for d in zip(pointers.tolist(), lengths.tolist(), strict=True)], np.int64)
        self.add(order, own, offsets, lengths, dests)

    def freeze(self) -> None:
        """Copy every datagram queued so far into a buffer of the outbox's own: the rows they point into may
        take new blocks before the batch is sent (a batch cut into segments)."""
        if not self._order:
            return
        order, pointer, length, dest = self._merged()
        queued = self._keep  # alive until copied
        self.__init__()
        self.add_copies(order, pointer, length, dest)
        del queued

    def _merged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        parts = (self._order, self._pointer, self._length, self._dest)
        order, pointer, length, dest = (part[0] if len(part) == 1 else np.concatenate(part) for part in parts)
        if len(order) > 1 and (order[1:] < order[:-1]).any():
            sort = np.argsort(order, kind="stable")
            order, pointer, length, dest = order[sort], pointer[sort], length[sort], dest[sort]
        return order, pointer, length, dest

    def send(self, sender: Any) -> None:
        """Queue everything on `sender` (a `batch_io.Sender`), in packet order, and forget it (the sender keeps
        the buffers alive until its flush)."""
        if self._order:
            _, pointer, length, dest = self._merged()
            sender.add(pointer, length, dest)
            sender.keep(self._keep)
        self.__init__()

    def datagrams(self) -> list[tuple[bytes, list[int]]]:
        """(datagram, destinations) in send order, a multicast as one entry: for tests and single packets."""
        if not self._order:
            return []
        import ctypes

        _, pointer, length, dest = self._merged()
        out: list[tuple[bytes, list[int]]] = []
        last = None
        for p, n, d in zip(pointer.tolist(), length.tolist(), dest.tolist(), strict=True):
            if last == (p, n):
                out[-1][1].append(d)
            else:
                out.append((ctypes.string_at(p, n), [d]))
                last = (p, n)
        return out
