"""Batched I/O over real loopback sockets, on both data paths (numpy around ctypes, and C) and across them: what
one recvmmsg returns is what was sent, datagram for datagram (with and without segmentation offload), sources and
truncation are reported, a closed port is refused; and a batch's header array says exactly what `unpack` says of
each datagram."""

from __future__ import annotations

import random
import socket
import time

import numpy as np
import pytest

from stepscope.innet.wire import batch_io, fastpath
from stepscope.innet.wire import protocol as p


def _udp(rcvbuf: int = 4 << 20) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def _receive_all(receiver: batch_io.Receiver, expected: int) -> list[tuple[bytes, int]]:
    got, deadline = [], time.monotonic() + 5
    while len(got) < expected and time.monotonic() < deadline:
        batch = receiver.receive()
        got += [(batch.datagram(i), int(batch.sources[i]) if batch.sources is not None else 0)
                for i in range(len(batch))]
    return got


@pytest.mark.parametrize("offload,sender_path", [(True, "numpy"), (True, "c"), (False, "numpy"), (False, "c")])
def test_a_queue_to_two_peers_arrives_datagram_for_datagram(offload, sender_path, data_path):
    if sender_path == "c" and fastpath.C is None:
        pytest.skip(f"the C fast path is not built: {fastpath.NOT_BUILT}")
    rng = random.Random(7)
    sender_sock, a, b = _udp(), _udp(), _udp()
    sender = batch_io.Sender(sender_sock, gso=offload, data_path=sender_path)
    receivers = {peer: batch_io.Receiver(peer, sources=True, gro=offload, data_path=data_path) for peer in (a, b)}
    dest = {peer: sender.address(batch_io.address_key(*peer.getsockname())) for peer in (a, b)}
    # trains of equal sizes (one GSO message each), a short last one, single odd sizes, an empty datagram
    sizes = [1056] * 70 + [200] + [64] * 3 + [1] + [0] + [rng.randrange(1, 9000) for _ in range(20)]
    payloads = [bytes(rng.randrange(256) for _ in range(size)) for size in sizes]
    buffer = np.frombuffer(b"".join(payloads), np.uint8)
    offsets = np.cumsum([0, *sizes[:-1]]).astype(np.uint64)
    to = np.array([dest[a] if i % 3 else dest[b] for i in range(len(sizes))])
    sender.add(buffer.ctypes.data + offsets, np.array(sizes), to)
    assert sender.flush() == len(sizes) and sender.dropped == 0
    source = batch_io.address_key(*sender_sock.getsockname())
    for peer, mine in ((a, to == dest[a]), (b, to == dest[b])):
        got = _receive_all(receivers[peer], int(mine.sum()))
        assert [data for data, _ in got] == [payloads[i] for i in np.flatnonzero(mine)]  # each peer in send order
        assert {key for _, key in got} == {source}
    assert receivers[a].gro == offload and sender.gso == offload


def test_a_datagram_longer_than_its_buffer_is_reported_cut_and_a_closed_port_refused(data_path):
    sender_sock, peer = _udp(), _udp()
    receiver = batch_io.Receiver(peer, messages=4, message_bytes=128, gro=False, data_path=data_path)
    sender_sock.sendto(b"x" * 100, peer.getsockname())
    sender_sock.sendto(b"y" * 500, peer.getsockname())
    time.sleep(0.05)
    batch = receiver.receive()
    assert batch.lengths.tolist() == [100, -1] and batch.datagram(0) == b"x" * 100
    closed = _udp()
    port = closed.getsockname()[1]
    closed.close()
    client = _udp()
    client.connect(("127.0.0.1", port))
    sender = batch_io.Sender(client, data_path=data_path)
    data = np.zeros(64, np.uint8)
    with pytest.raises(ConnectionRefusedError):
        for _ in range(20):  # the ICMP error comes back with a later call
            sender.add(np.array([data.ctypes.data], np.uint64), np.array([64]))
            sender.flush()
            batch_io.Receiver(client, data_path=data_path).receive()
            time.sleep(0.01)


def test_batch_headers_say_what_unpack_says_of_each_datagram():
    rng = random.Random(3)
    valid = [p.pack(p.DATA, 5, 2, 256, 3, 1, 4, p.VERSION | p.RETRANSMIT, contributors=3, exponent=-7,
                    next_exponent=9, op_flags=p.QUANTIZED, values=np.arange(5, dtype=np.int32)),
             p.pack(p.RESULT, 2**32 - 1, 2**32 - 2, 2**31 - 1, 65_535, p.SWITCH_RANK, 1024, p.OLD),
             p.pack(p.STATS, 0, 0, 0, 0, 0, 0, 0)]
    datagrams = []
    for _ in range(400):
        packet = bytearray(rng.choice(valid))
        for _ in range(rng.choice([0, 0, 1, 2])):
            packet[rng.randrange(len(packet))] = rng.randrange(256)
        datagrams.append(bytes(packet[:rng.choice([len(packet), rng.randrange(len(packet) + 1)])]))
    lengths = np.array([len(d) for d in datagrams])
    offsets = np.cumsum([0, *(lengths[:-1] + 3)])  # unaligned, as in a GRO train of odd sizes
    buffer = np.zeros(int(offsets[-1] + lengths[-1]) + batch_io.PAD, np.uint8)
    for data, offset in zip(datagrams, offsets, strict=True):
        buffer[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
    headers, ok = p.parse_headers(buffer, offsets, lengths)
    for i, data in enumerate(datagrams):
        try:
            h = p.unpack(data)
        except p.ProtocolError:
            assert not ok[i], data
            continue
        assert ok[i] and tuple(headers[i].tolist()[2:15]) == tuple(h), data
    assert 0 < ok.sum() < len(datagrams)
