"""The in-network aggregation wire format, version 1: one UDP datagram = a 32-byte header + int32 values.

Every field is little-endian (the hosts that run workers and the software switch are little-endian, so
numpy adds the values without byte swapping; a hardware port would convert at its edge).

    byte  size  field          meaning
    0     2     magic          b"IN"
    2     1     version        protocol version, 1
    3     1     type           DATA, RESULT, JOIN, JOINED, LEAVE, STATUS, STATS, STATS_REPLY (below)
    4     4     job id         u32: which job (session); the switch never mixes jobs
    8     4     op id          u32: which all-reduce of the job (1, 2, ... in issue order)
    12    4     offset         u32: element offset of the block's first value in the op's tensor (< 2**31)
    16    2     slot           u16: slot of the job's pool this block uses (stream index mod slots)
    18    2     rank           u16: sender's rank (RESULT: 0xFFFF, the switch)
    20    2     world          u16: workers in the job
    22    2     flags          u16: VERSION, RETRANSMIT, PROLOGUE, TIMEOUT, K_REACHED, OLD, BAD, SYNC, SERVED
    24    2     count          u16: number of 32-bit values that follow
    26    2     contributors   u16: DATA: fastest-K wanted (0 = world); RESULT: contributions summed
    28    1     exponent       i8: shared exponent the block's values were quantized with
    29    1     next exponent  i8: DATA: this worker's exponent of the data block that waits on this
                               packet's result (one round ahead); RESULT: the max over the
                               contributors (-128: none)
    30    1     op flags       u8: AVERAGE, QUANTIZED, PREEMPTIVE
    31    1     reserved       must be 0
    32    4*count values       int32

A block is identified inside its job by (op id, phase, offset), packed into one ordered integer
(`block_key`): blocks of a job form one stream, ordered by op, then the exponent-only prologue, then data.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MAGIC = b"IN"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<2sBBIIIHHHHHHbbBB")
HEADER_BYTES = HEADER.size  # 32
MAX_DATAGRAM = 65_507  # largest UDP payload over IPv4
MAX_VALUES = (MAX_DATAGRAM - HEADER_BYTES) // 4  # 16,368 values per packet in emulation
VALUES_PER_PIPE = 64  # a Tofino pipeline adds 64 32-bit values per packet at line rate
MAX_PIPES = 4
SWITCH_RANK = 0xFFFF
MAX_WORLD = 1024
MAX_OFFSET = 2**31 - 1

# Tofino's timer unit: 2**16 ns; a requested timeout is rounded up to whole ticks.
TICK_S = 65_536e-9

# ---- packet types --------------------------------------------------------------------------------
DATA = 1         # worker -> switch: a block's contribution (or an exponent-only prologue block)
RESULT = 2       # switch -> workers: the aggregated block (multicast; unicast when re-served)
JOIN = 3         # worker -> switch: create or join a job; values = JoinParams
JOINED = 4       # switch -> worker: accepted (values = JoinParams + members joined) or BAD (values[0] = reason)
LEAVE = 5        # worker -> switch: this rank is done with the job
STATUS = 6       # switch -> worker: answer to a duplicate of a still-open block; values = contributor bitmap
STATS = 7        # worker -> switch: ask for the job's counters (job id 0: the switch's totals)
STATS_REPLY = 8  # switch -> worker: counters as int64 pairs (count = 2 * len(COUNTERS))
TYPE_NAMES = {DATA: "data", RESULT: "result", JOIN: "join", JOINED: "joined", LEAVE: "leave", STATUS: "status",
              STATS: "stats", STATS_REPLY: "stats-reply"}

# ---- flags (u16) ---------------------------------------------------------------------------------
VERSION = 0x0001     # which of the slot's two copies (shadow versions) this block uses
RETRANSMIT = 0x0002  # the worker sends this packet again (its timer expired)
PROLOGUE = 0x0004    # exponent-only block of an op's first round (count 0)
TIMEOUT = 0x0008     # result completed by the straggler timeout with fewer than world contributions
K_REACHED = 0x0010   # result completed preemptively as soon as K contributions arrived
OLD = 0x0020         # reply: the switch no longer holds this block (no values)
BAD = 0x0040         # reply: request rejected
SYNC = 0x0080        # JOIN: a poll waiting for every rank to join
SERVED = 0x0100      # result re-sent to one worker (a retransmission or a late packet asked for it)

# ---- op flags (u8) -------------------------------------------------------------------------------
AVERAGE = 0x01       # the workers divide the sum by the contributor count
QUANTIZED = 0x02     # values are float32 quantized with the block's shared exponent (else raw int32)
PREEMPTIVE = 0x04    # complete at K contributions without waiting for the timeout

NO_EXPONENT = -128

# ---- JOINED rejection reasons ----------------------------------------------------------------------
REJECT_REASONS = {1: "malformed join", 2: "job exists with different parameters", 3: "switch job table full",
                  4: "job needs more memory than the switch allows per job", 5: "rank outside the job",
                  6: "this rank already joined from another address"}

# Switch counters, in wire order (STATS_REPLY) and table order.
COUNTERS = ("ok", "to", "kr", "re", "dup", "old", "bad", "sy", "rx", "tx")


class ProtocolError(ValueError):
    """A datagram that is not a valid version-1 packet."""


class Header(NamedTuple):
    """A decoded header (the fields of `HEADER` after magic and version; a tuple: decoding is hot)."""

    type: int
    job: int
    op: int
    offset: int
    slot: int
    rank: int
    world: int
    flags: int
    count: int
    contributors: int
    exponent: int
    next_exponent: int
    op_flags: int


def pack(type_: int, job: int, op: int, offset: int, slot: int, rank: int, world: int, flags: int,
         contributors: int = 0, exponent: int = 0, next_exponent: int = NO_EXPONENT, op_flags: int = 0,
         values: np.ndarray | bytes | None = None) -> bytes:
    """One datagram; `values` is an int32 array (or its little-endian bytes) or None."""
    if values is None:
        payload, count = b"", 0
    elif isinstance(values, (bytes, bytearray, memoryview)):
        payload, count = bytes(values), len(values) // 4
    else:
        payload = np.ascontiguousarray(values, dtype="<i4").tobytes()
        count = len(payload) // 4
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, type_, job, op, offset, slot, rank, world, flags, count,
                       contributors, exponent, next_exponent, op_flags, 0) + payload


def unpack(data: bytes) -> Header:
    """Decode and validate a header (magic, version, type, length); raises ProtocolError."""
    if len(data) < HEADER_BYTES:
        raise ProtocolError(f"datagram of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    (magic, version, type_, job, op, offset, slot, rank, world, flags, count, contributors, exponent,
     next_exponent, op_flags, reserved) = HEADER.unpack_from(data)
    if magic != MAGIC or version != PROTOCOL_VERSION or reserved:
        raise ProtocolError("not an innet version-1 packet")
    if type_ not in TYPE_NAMES:
        raise ProtocolError(f"unknown packet type {type_}")
    if len(data) != HEADER_BYTES + 4 * count:
        raise ProtocolError(f"length {len(data)} does not match {count} values")
    return Header(type_, job, op, offset, slot, rank, world, flags, count, contributors, exponent,
                  next_exponent, op_flags)


def values_of(data: bytes, count: int) -> np.ndarray:
    """The packet's int32 values as a read-only view (no copy)."""
    return np.frombuffer(data, dtype="<i4", count=count, offset=HEADER_BYTES)


def with_flags(packet: bytes, extra: int) -> bytes:
    """The same packet with `extra` flag bits set (a retransmission reuses the stored datagram)."""
    flags = struct.unpack_from("<H", packet, 22)[0] | extra
    return packet[:22] + struct.pack("<H", flags) + packet[24:]


def block_key(op: int, prologue: bool, offset: int) -> int:
    """Order of a block in its job's stream: op, then prologue before data, then offset."""
    return (op << 32) | (0 if prologue else 1 << 31) | offset


# ---- job parameters (JOIN payload) ------------------------------------------------------------------
@dataclass(frozen=True)
class JoinParams:
    """What a job asks of the switch; every rank of a job must send the same values."""

    values_per_packet: int
    """k: 32-bit values per block (64 x pipes on a Tofino; emulation allows up to MAX_VALUES)."""
    slots: int
    """s: blocks in flight per job (the pool size; two shadow versions each)."""
    sto_ticks: int
    """Straggler timeout in switch ticks of 65.536 us, counted from a block's first contribution."""
    history: int
    """Completed results kept for late ranks beyond the slot pool (an emulator extension; 0 = none)."""

    def to_values(self) -> np.ndarray:
        return np.array([self.values_per_packet, self.slots, self.sto_ticks, self.history], dtype="<i4")

    @classmethod
    def from_values(cls, values: np.ndarray) -> JoinParams:
        if len(values) < 4:
            raise ProtocolError("join payload too short")
        return cls(*(int(v) for v in values[:4]))

    def problem(self) -> str | None:
        """Why these parameters are invalid, or None."""
        if not 1 <= self.values_per_packet <= MAX_VALUES:
            return f"values per packet must be 1..{MAX_VALUES}"
        if not 1 <= self.slots <= 65_535:
            return "slots must be 1..65535"
        if not 0 <= self.sto_ticks <= 2**31 - 1:
            return "straggler timeout out of range"
        if not 0 <= self.history <= 2**20:
            return "history out of range"
        return None


def sto_ticks_from_ms(sto_ms: float) -> int:
    """A straggler timeout in ms as whole switch ticks, rounded up (as the Tofino timer does)."""
    if sto_ms < 0 or not math.isfinite(sto_ms):
        raise ValueError(f"straggler timeout must be >= 0 ms, got {sto_ms}")
    ticks = sto_ms * 1e-3 / TICK_S
    return int(math.ceil(ticks - 1e-9))


# A STATS request for job id 0 asks for the switch's own totals, in this order (a liveness probe too).
SWITCH_COUNTERS = ("jobs", "rx", "tx", "bad", "tx_dropped", "internal_errors", "jobs_created", "jobs_finished",
                   "jobs_expired", "joins_rejected", "jobs_evicted", "cpu_us", "fast_path")
"""`cpu_us`: CPU time the answering switch process has used (benchmarks divide packets by it); `fast_path`: 1
where it runs the C fast path (`wire.fastpath`), 0 on the numpy path."""


def stats_payload(counters: dict[str, int], names: tuple[str, ...] = COUNTERS) -> bytes:
    return np.array([counters.get(name, 0) for name in names], dtype="<i8").tobytes()


def stats_from_payload(data: bytes, count: int, names: tuple[str, ...] = COUNTERS) -> dict[str, int]:
    values = np.frombuffer(data, dtype="<i8", count=count // 2, offset=HEADER_BYTES)
    # a reply may name fewer or more counters than `names` (another version): the common ones count
    return {name: int(v) for name, v in zip(names, values, strict=False)}


def bitmap_words(mask: int, world: int) -> np.ndarray:
    """A contributor bitmask as int32 words (rank r is bit r % 32 of word r // 32)."""
    words = (world + 31) // 32
    return np.array([(mask >> (32 * i)) & 0xFFFFFFFF for i in range(words)], dtype=np.uint32).view("<i4")


def ranks_in_bitmap(values: np.ndarray, world: int) -> list[int]:
    words = values.view(np.uint32)
    return [r for r in range(world) if r // 32 < len(words) and (int(words[r // 32]) >> (r % 32)) & 1]


# ---- whole batches ----------------------------------------------------------------------------------
HEADER_DTYPE = np.dtype([("magic", "S2"), ("version", "u1"), ("type", "u1"), ("job", "<u4"), ("op", "<u4"),
                         ("offset", "<u4"), ("slot", "<u2"), ("rank", "<u2"), ("world", "<u2"), ("flags", "<u2"),
                         ("count", "<u2"), ("contributors", "<u2"), ("exponent", "i1"), ("next_exponent", "i1"),
                         ("op_flags", "u1"), ("reserved", "u1")])
"""The header as a numpy record: a batch's headers parse into one structured array (the fields of `HEADER`)."""
assert HEADER_DTYPE.itemsize == HEADER_BYTES


RECORD = np.dtype((np.void, HEADER_BYTES))
"""A header as 32 opaque bytes: gathering these is ~40x faster than gathering HEADER_DTYPE records."""
_FIRST_WORD = int.from_bytes(MAGIC + bytes([PROTOCOL_VERSION, 0]), "little")  # magic and version, type 0


def parse_headers(buffer: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The headers of the datagrams at `offsets` (lengths `lengths`) of `buffer` (uint8, readable for 32 bytes
    past every offset) as a HEADER_DTYPE array, and which of them are valid version-1 packets (`unpack`'s checks:
    magic, version, reserved byte, known type, length = header + 4 x count)."""
    every_offset = np.ndarray((len(buffer) - HEADER_BYTES + 1,), RECORD, buffer, 0, (1,))  # a record per byte
    headers = every_offset[offsets].view(HEADER_DTYPE)  # one gather of 32-byte records, no per-packet object
    words = headers.view("<u4").reshape(-1, HEADER_BYTES // 4)
    kind = words[:, 0] >> 24
    valid = (((words[:, 0] & 0xFFFFFF) == _FIRST_WORD) & (kind >= DATA) & (kind <= STATS_REPLY)
             & ((words[:, 7] >> 24) == 0)  # the reserved byte
             & (lengths == HEADER_BYTES + 4 * (words[:, 6] & 0xFFFF).astype(np.int64)))  # count
    return headers, valid


def take_headers(headers: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`headers[index]`, gathered as opaque 32-byte records (fast)."""
    return headers.view(RECORD)[index].view(HEADER_DTYPE)
