"""The packets a worker has in flight, as arrays over its slots: a slot carries one packet at a time, so its
datagram stays in row `slot` of one preallocated buffer until its result arrives (a retransmission re-sends the
row as it is, flagged), with its retransmission timer: sent time, number of sends, deadline. Timers are checked
for all slots at once; a packet's timeout grows by `backoff` per retransmission (`rto.RetransmitTimeout`)."""

from __future__ import annotations

import numpy as np

from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.rto import RetransmitTimeout


class SendWindow:
    """One worker's packets in flight, one per slot."""

    def __init__(self, slots: int, values_per_packet: int, rto: RetransmitTimeout) -> None:
        self.rto = rto
        self.stride = p.HEADER_BYTES + 4 * values_per_packet
        self.rows = np.zeros((slots, self.stride), np.uint8)
        self.index = np.full(slots, -1, np.int64)  # stream index in flight on each slot (-1: idle)
        self.length = np.zeros(slots, np.int64)
        self.sent_at = np.zeros(slots)
        self.deadline = np.full(slots, np.inf)
        self.sends = np.zeros(slots, np.int64)
        self.built = np.zeros(slots, bool)  # written by a sender thread (only built packets are re-sent)

    @property
    def in_flight(self) -> int:
        return int(np.count_nonzero(self.index >= 0))

    def idle(self) -> np.ndarray:
        return self.index < 0

    def occupy(self, slots: np.ndarray, indices: np.ndarray, now: float) -> None:
        """Stream packets `indices` go out on `slots` now (their rows are being built)."""
        self.index[slots] = indices
        self.sent_at[slots] = now
        self.sends[slots] = 1
        self.deadline[slots] = now + self.rto.for_send(1)
        self.built[slots] = False

    def mark_built(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        self.length[slots] = lengths
        self.built[slots] = True

    def answer(self, indices: np.ndarray, now: float) -> None:
        """Results for stream packets `indices` arrived: free their slots; one round-trip sample per batch, from
        first transmissions only (Karn's rule: a retransmitted packet's round trip is ambiguous): the longest,
        that of the packet that queued behind the rest of its window (a median sample made the timeout fire on
        the deep end of every window)."""
        slots = indices % len(self.index)
        mine = slots[self.index[slots] == indices]
        once = mine[self.sends[mine] == 1]
        if len(once):
            self.rto.sample(float(np.max(now - self.sent_at[once])))
        self.index[mine] = -1
        self.deadline[mine] = np.inf

    def due(self, now: float) -> np.ndarray:
        """Slots whose packet's timer expired: flagged RETRANSMIT, their timers restarted longer; to re-send."""
        slots = np.flatnonzero(self.built & (self.deadline <= now))
        if len(slots):
            self.sends[slots] += 1
            timeout = np.minimum(self.rto.base() * self.rto.backoff ** (self.sends[slots] - 1), self.rto.max_s)
            self.deadline[slots] = now + timeout
            flags = self.rows[:, 22:24].view("<u2")[:, 0]  # a view of every row's flags field
            flags[slots] |= p.RETRANSMIT
        return slots

    def next_deadline(self) -> float | None:
        deadline = float(self.deadline[self.built].min()) if self.built.any() else np.inf
        return None if deadline == np.inf else deadline

    def pointers(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Addresses and lengths of the datagrams in `slots` (for a batched send)."""
        return self.rows.ctypes.data + (slots * self.stride).astype(np.uint64), self.length[slots]
