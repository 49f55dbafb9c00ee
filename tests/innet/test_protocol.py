"""The wire format, tick rounding and quantization (pure functions, no sockets)."""

import numpy as np
import pytest

from stepscope.innet.wire import protocol as p
from stepscope.innet.wire.quantize import (
    INT32_MAX,
    QuantizationError,
    block_exponents,
    dequantize,
    error_bound,
    quantize,
)


def test_header_is_32_bytes_and_round_trips():
    values = np.array([1, -2, INT32_MAX, -INT32_MAX], dtype=np.int32)
    packet = p.pack(p.DATA, 0xDEADBEEF, 7, 4096, 3, 2, 4, p.VERSION | p.RETRANSMIT, contributors=3, exponent=-5,
                    next_exponent=12, op_flags=p.AVERAGE | p.QUANTIZED, values=values)
    assert p.HEADER_BYTES == 32 and len(packet) == 32 + 16
    assert packet[:2] == b"IN" and packet[2] == 1 and packet[3] == p.DATA
    h = p.unpack(packet)
    assert (h.job, h.op, h.offset, h.slot, h.rank, h.world) == (0xDEADBEEF, 7, 4096, 3, 2, 4)
    assert h.flags == p.VERSION | p.RETRANSMIT and h.count == 4 and h.contributors == 3
    assert (h.exponent, h.next_exponent, h.op_flags) == (-5, 12, p.AVERAGE | p.QUANTIZED)
    assert p.values_of(packet, h.count).tolist() == values.tolist()
    # byte layout: job id little-endian at bytes 4..7, offset at 12..15, count at 24..25
    assert packet[4:8] == (0xDEADBEEF).to_bytes(4, "little") and packet[12:16] == (4096).to_bytes(4, "little")
    assert packet[24:26] == (4).to_bytes(2, "little")


@pytest.mark.parametrize("data", [b"", b"IN", b"XX" + bytes(30), p.pack(p.DATA, 1, 1, 0, 0, 0, 1, 0)[:-1] + b"\x09",
                                  b"IN\x02" + p.pack(p.DATA, 1, 1, 0, 0, 0, 1, 0)[3:], b"IN\x01\x63" + bytes(28),
                                  p.pack(p.DATA, 1, 1, 0, 0, 0, 1, 0, values=np.ones(2, np.int32))[:-4]])
def test_malformed_datagrams_are_rejected(data):
    with pytest.raises(p.ProtocolError):
        p.unpack(data)


def test_retransmission_flag_and_block_order():
    packet = p.pack(p.DATA, 1, 2, 64, 0, 0, 2, p.VERSION)
    assert p.unpack(p.with_flags(packet, p.RETRANSMIT)).flags == p.VERSION | p.RETRANSMIT
    keys = [p.block_key(1, True, 0), p.block_key(1, True, 64), p.block_key(1, False, 0), p.block_key(2, True, 0)]
    assert keys == sorted(keys)  # op, then prologue before data, then offset


def test_sto_is_rounded_up_to_ticks():
    assert p.TICK_S == 65.536e-6
    assert p.sto_ticks_from_ms(0.05) == 1 and p.sto_ticks_from_ms(1.0) == 16 and p.sto_ticks_from_ms(12.5) == 191
    assert p.sto_ticks_from_ms(0.065536) == 1 and p.sto_ticks_from_ms(0.0656) == 2 and p.sto_ticks_from_ms(0) == 0


def test_join_parameters_and_bitmaps():
    params = p.JoinParams(256, 64, 16, 1024)
    assert p.JoinParams.from_values(params.to_values()) == params and params.problem() is None
    assert p.JoinParams(0, 64, 16, 0).problem() and p.JoinParams(256, 0, 16, 0).problem()
    words = p.bitmap_words((1 << 0) | (1 << 33), 40)
    assert p.ranks_in_bitmap(words, 40) == [0, 33]


def test_quantization_error_stays_within_the_bound():
    rng = np.random.default_rng(0)
    world, k = 4, 64
    inputs = [(rng.standard_normal(1000) * 10 ** rng.uniform(-3, 3)).astype(np.float32) for _ in range(world)]
    exponents = block_exponents(np.max(np.abs(np.stack(inputs)), axis=0), k)
    for block, exponent in enumerate(exponents):
        piece = slice(block * k, (block + 1) * k)
        total = sum(quantize(x[piece], int(exponent), world).astype(np.int64) for x in inputs)
        assert np.abs(total).max() <= INT32_MAX  # n contributions cannot overflow
        result = dequantize(total.astype(np.int32), int(exponent), world)
        exact = np.sum([x[piece].astype(np.float64) for x in inputs], axis=0)
        bound = error_bound(world, int(exponent), world, False) + np.abs(exact) * 2.0**-23
        assert np.all(np.abs(result - exact) <= bound)


def test_exponents_and_non_finite_values():
    assert block_exponents(np.array([0.5, 0, 0, 0, 1.0, 3.0], np.float32), 4).tolist() == [0, 2]
    assert block_exponents(np.zeros(3, np.float32), 4).tolist() == [-126]
    with pytest.raises(QuantizationError):
        block_exponents(np.array([1.0, np.inf], np.float32), 4)
    with pytest.raises(QuantizationError):
        block_exponents(np.array([np.nan], np.float32), 4)


def test_a_block_sent_with_an_exponent_agreed_without_this_rank_is_counted_as_clipped(data_path):
    from stepscope.innet.worker.op import Op

    values = np.full(8, 1000.0, dtype=np.float32)  # exponent 10
    op = Op(1, values, average=False, min_count=1, preemptive=False, values_per_packet=8, slots=4, world=2,
            data_path=data_path)
    op.agreed[0] = 1  # agreed by the other rank alone (|x| < 2)
    packet = op.build(op.prologue, job=7, rank=1, slot=0, version=0)
    assert op.clipped == {0}
    ints = p.values_of(packet, 8)
    assert np.all(ints == INT32_MAX // 2)  # the values went out clipped
    op.agreed[0] = 10
    op.clipped.clear()
    op.build(op.prologue, job=7, rank=1, slot=0, version=0)
    assert op.clipped == set()


def test_blocks_quantize_and_dequantize_to_exactly_what_the_per_block_functions_give():
    from stepscope.innet.wire.quantize import dequantize_blocks, quantize_blocks

    rng = np.random.default_rng(5)
    for world in (1, 2, 3, 1024):
        values = (rng.standard_normal((40, 33)) * np.exp2(rng.integers(-40, 40, (40, 1)))).astype(np.float32)
        exponents = block_exponents(values.reshape(-1), 33).astype(np.int64)
        exponents[::4] -= 2  # agreed below this rank's own: its values are clipped
        ints = quantize_blocks(values, exponents, world)
        assert np.array_equal(ints, np.stack([quantize(v, int(e), world) for v, e in zip(values, exponents,
                                                                                        strict=True)]))
        divisors = rng.integers(1, world + 1, 40)
        assert np.array_equal(dequantize_blocks(ints, exponents, world, divisors), np.stack(
            [dequantize(i, int(e), world, int(d)) for i, e, d in zip(ints, exponents, divisors, strict=True)]))


def test_the_integer_average_truncates_toward_zero_like_c():
    from stepscope.innet.worker.op import truncated_average

    rng = np.random.default_rng(6)
    sums = rng.integers(-(2**31), 2**31, (500, 16)).astype(np.int32)
    sums[0, :6] = [-(2**31), 2**31 - 1, -7, 7, -1, 0]
    counts = rng.integers(1, 1025, 500)
    counts[0] = 2
    wide = sums.astype(np.int64)
    expected = np.sign(wide) * (np.abs(wide) // counts[:, None])  # C's division, in exact integers
    assert np.array_equal(truncated_average(sums, counts), expected)
    assert truncated_average(sums, counts)[0, :6].tolist() == [-(2**30), 2**30 - 1, -3, 3, 0, 0]
