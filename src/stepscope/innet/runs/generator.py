"""A packet generator that drives a switch as `world` workers would, without workers in the way: each rank's DATA
packets are prebuilt in a ring of 2s datagrams and only their op field changes, once per lap; results are counted,
not used.

Stream packet i of every rank uses slot i mod s and version (i div s) mod 2 with block key (1 + i div 2s, data,
(i mod 2s) x k), so every row sees increasing keys, as from self-clocked workers: ring position r = i mod 2s fixes
slot, version and offset, the lap i div 2s the op. Rank r's value j is
(r + 1) x (j mod 7 + 1), so every result must hold world(world + 1)/2 x (j mod 7 + 1): the generator checks the
first and last value of every result rank 0 receives. The other ranks' copies of each result (the switch
multicasts) are not read: their sockets' small buffers overflow and the kernel drops them after the switch
sent them, so the generator's core is spent on sending. Packets in flight are bounded by `window` per rank (a
result frees a place: the switch answers as fast as it can), and by a rate limit if one is given.

    with Generator(("127.0.0.1", 9000), world=2, k=256, slots=512, window=256) as gen:
        counts = gen.run(duration_s=2.0, rate_pps=None)
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass

import numpy as np

from stepscope.innet.wire import batch_io, fastpath
from stepscope.innet.wire import protocol as p

SOCKET_BUFFER_BYTES = 8 << 20


@dataclass
class GeneratorCounts:
    """What one run of the generator sent and got back."""

    sent: int = 0
    """DATA packets sent, all ranks."""
    results: int = 0
    """RESULT packets rank 0 received (the switch multicasts each to every rank)."""
    wrong: int = 0
    """Results whose checked values were not the expected sums."""
    stalled: bool = False
    """No result came for `STALL_S` with packets in flight (a packet was lost): the run stopped early."""
    seconds: float = 0.0


STALL_S = 0.5


class Generator:
    """`world` ranks of one job, each a UDP socket connected to the switch at `address` (a list: one address per
    switch shard, slot j served by shard j mod shards)."""

    def __init__(self, addresses: list[tuple[str, int]], world: int, k: int, slots: int, window: int, job_id: int,
                 offload: bool = True) -> None:
        self.world, self.k, self.slots, self.window, self.job_id = world, k, slots, window, job_id
        self.shards = len(addresses)
        self.rows = 2 * slots
        self.stride = p.HEADER_BYTES + 4 * k
        self.path = fastpath.name(fastpath.resolve())
        """'c' or 'numpy': the data path of the generator's own sockets (`wire.fastpath`)."""
        self.socks, self.senders, self.receivers = [], [], []
        for _rank in range(world):
            for address in addresses:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES if not _rank else 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                sock.connect(address)
                sock.setblocking(False)
                self.socks.append(sock)
                self.senders.append(batch_io.Sender(sock, gso=offload, data_path=self.path))
                self.receivers.append(batch_io.Receiver(sock, gro=offload, data_path=self.path))
        self.rings = np.zeros((world, self.rows, self.stride), np.uint8)
        headers = self.rings[:, :, :p.HEADER_BYTES].view(p.HEADER_DTYPE)[:, :, 0]
        headers["magic"], headers["version"], headers["type"] = p.MAGIC, p.PROTOCOL_VERSION, p.DATA
        headers["job"], headers["world"], headers["count"] = job_id, world, k
        headers["rank"] = np.arange(world)[:, None]
        ring = np.arange(self.rows)
        headers["offset"], headers["slot"], headers["flags"] = ring * k, ring % slots, ring // slots  # flags: version
        self.headers = headers
        self.pointers = [self.rings[rank].ctypes.data + (ring * self.stride).astype(np.uint64) for rank in range(world)]
        self.lengths = np.full(self.rows, self.stride)
        self.shard_of = ring % slots % self.shards
        pattern = np.arange(k) % 7 + 1
        self.rings.view("<i4")[:, :, p.HEADER_BYTES // 4:] = (np.arange(world)[:, None, None] + 1) * pattern
        self.expected = (world * (world + 1) // 2) * pattern[[0, -1]]
        self.next = 0  # the next stream packet (every rank in step)

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in self.socks:
            sock.close()

    def join(self, timeout_s: float = 5.0) -> None:
        """JOIN every rank (on every shard) and wait until all joined; TimeoutError if the switch does not."""
        params = p.JoinParams(self.k, self.slots, 2**20, 0).to_values()  # long STO: nobody straggles on purpose
        deadline = time.monotonic() + timeout_s
        pending = set(range(len(self.socks)))
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError("the switch did not accept the generator's ranks")
            for i in list(pending):
                rank = i // self.shards
                self.socks[i].send(p.pack(p.JOIN, self.job_id, 0, 0, 0, rank, self.world, p.SYNC, values=params))
            time.sleep(0.01)
            for i in list(pending):
                try:
                    while True:
                        data = self.socks[i].recv(65_536)
                        h = p.unpack(data)
                        if h.type == p.JOINED and not h.flags & p.BAD and p.values_of(data, h.count)[4] >= self.world:
                            pending.discard(i)
                except (BlockingIOError, p.ProtocolError):
                    pass

    def run(self, duration_s: float, rate_pps: float | None = None) -> GeneratorCounts:
        """Send for `duration_s` (at most `rate_pps` packets per second over all ranks), then wait for the last
        results; counts what was sent and answered."""
        counts = GeneratorCounts()
        got = np.zeros(self.shards, np.int64)  # results rank 0 received, per shard
        start = last_result = time.perf_counter()
        sent_here = 0
        while True:
            now = time.perf_counter()
            if now - start >= duration_s:
                break
            done = self._receive(got, counts)
            if done:
                last_result = now
            room = int(got.sum()) + self.window - sent_here
            if rate_pps:
                room = min(room, int(rate_pps / self.world * (now - start)) - sent_here)
            if room > 0:
                burst = min(room, 16 * batch_io.MAX_SEGMENTS)
                self._send(burst)
                sent_here += burst
            elif not done:
                if now - last_result > STALL_S:
                    counts.stalled = True
                    break
                select.select(self.socks[:self.shards], [], [], 0.0005 if rate_pps else 0.002)
        while not counts.stalled and int(got.sum()) < sent_here:  # every packet sent is answered before the end
            if not self._receive(got, counts):
                if time.perf_counter() - last_result > STALL_S:
                    counts.stalled = True
                select.select(self.socks[:self.shards], [], [], 0.002)
            else:
                last_result = time.perf_counter()
        counts.sent = sent_here * self.world
        counts.seconds = time.perf_counter() - start
        return counts

    def _send(self, count: int) -> None:
        while count:
            lap, at = divmod(self.next, self.rows)
            if at == 0:  # a new lap: every block key moves on (the last lap's datagrams are sent: copied)
                self.headers["op"] = lap + 1
            ring = slice(at, at + min(count, self.rows - at))
            for rank in range(self.world):
                for shard in range(self.shards):
                    mine = slice(None) if self.shards == 1 else self.shard_of[ring] == shard
                    sender = self.senders[rank * self.shards + shard]
                    sender.add(self.pointers[rank][ring][mine], self.lengths[ring][mine])
                    sender.flush()
            self.next += ring.stop - ring.start
            count -= ring.stop - ring.start

    def _receive(self, got: np.ndarray, counts: GeneratorCounts) -> int:
        total = 0
        for i, receiver in enumerate(self.receivers[:self.shards]):  # rank 0's sockets
            while True:
                batch = receiver.receive()
                if not len(batch):
                    break
                headers, valid = p.parse_headers(batch.buffer, batch.offsets, batch.lengths)
                results = valid & (headers["type"] == p.RESULT) & (headers["job"] == self.job_id)
                n = int(np.count_nonzero(results))
                got[i] += n
                total += n
                offsets = batch.offsets[results] + p.HEADER_BYTES
                ends = offsets + 4 * (self.k - 1)
                first = batch.buffer[offsets[:, None] + np.arange(4)].copy().view("<i4")[:, 0]
                last = batch.buffer[ends[:, None] + np.arange(4)].copy().view("<i4")[:, 0]
                counts.wrong += int(np.count_nonzero((first != self.expected[0]) | (last != self.expected[1])))
        counts.results += total
        return total
