"""float32 <-> int32 quantization with a shared per-block exponent (SwitchML's scheme).

A switch adds only integers. Each block of k floats is scaled by f = INT32_MAX / (n * 2**e_max), where e_max
is the largest exponent of the block over all n workers (|x| < 2**e_max for every value), so a sum of n
scaled values cannot overflow int32. The workers agree on e_max one block ahead: a packet carries the
sender's exponent of the block that next reuses its slot, the switch keeps the max, and the result brings
it back, so the first round of every op is an extra exponent-only "prologue" round.

A worker whose exponent did not reach the max (it was late and the block completed without it) clips
its values to +-INT32_MAX // n, so a sum still cannot overflow; the error then is the clipped part.
"""

from __future__ import annotations

import numpy as np

from stepscope.innet.wire.protocol import NO_EXPONENT

INT32_MAX = 2**31 - 1
MIN_EXPONENT = -126  # float32's smallest normal exponent: smaller magnitudes quantize to (near) zero
MAX_EXPONENT = 127


class QuantizationError(ValueError):
    """Values that cannot be quantized (inf, nan or |x| >= 2**127)."""


NOT_FINITE = "cannot quantize inf or nan values for in-network aggregation"
TOO_LARGE = "values of magnitude >= 2**127 cannot be quantized to int32"
NO_AGREED_EXPONENT = "no agreed exponent for this block"


def block_exponents(values: np.ndarray, block: int) -> np.ndarray:
    """Per block of `block` values: the smallest e with |x| < 2**e for all x in the block (int16)."""
    flat = np.asarray(values).reshape(-1)
    blocks = -(-len(flat) // block)
    padded = np.zeros(blocks * block, dtype=np.float32)
    padded[:len(flat)] = np.abs(flat)
    maxabs = padded.reshape(blocks, block).max(axis=1)
    if not np.all(np.isfinite(maxabs)):
        raise QuantizationError(NOT_FINITE)
    _, exponents = np.frexp(maxabs.astype(np.float64))  # maxabs = m * 2**e with 0.5 <= m < 1
    exponents = np.where(maxabs == 0, MIN_EXPONENT, exponents)
    if np.any(exponents > MAX_EXPONENT):
        raise QuantizationError(TOO_LARGE)
    return np.maximum(exponents, MIN_EXPONENT).astype(np.int16)


def scale(world: int, exponent: int) -> float:
    """f = INT32_MAX / (n * 2**e): the factor from float to the shared integer grid."""
    return INT32_MAX / (world * 2.0 ** exponent)


def quantize(values: np.ndarray, exponent: int, world: int) -> np.ndarray:
    """round(x * f), clipped so that n contributions cannot overflow int32."""
    if exponent == NO_EXPONENT:
        raise QuantizationError(NO_AGREED_EXPONENT)
    limit = INT32_MAX // world
    scaled = np.multiply(values, scale(world, exponent), dtype=np.float64)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -limit, limit, out=scaled)
    return scaled.astype("<i4")


def dequantize(ints: np.ndarray, exponent: int, world: int, divisor: int = 1) -> np.ndarray:
    """The float sum (divisor 1) or average (divisor = contributors) of quantized contributions."""
    return (ints.astype(np.float64) / (scale(world, exponent) * divisor)).astype(np.float32)


def error_bound(world: int, exponent: int, contributors: int, average: bool) -> float:
    """Largest absolute error of a result element from rounding: 0.5 / f per contribution (plus float32
    rounding of the result, which callers add as a relative 2**-23)."""
    bound = contributors * 0.5 / scale(world, exponent)
    return bound / contributors if average else bound


# ---- whole batches of blocks (the same arithmetic, one numpy pass per step for all blocks) ----------
def scales(world: int, exponents: np.ndarray) -> np.ndarray:
    """`scale` of every block: INT32_MAX / (world * 2**e), computed exactly as the scalar version."""
    return INT32_MAX / (world * np.ldexp(1.0, exponents.astype(np.int64)))


def quantize_blocks(values: np.ndarray, exponents: np.ndarray, world: int, integers: bool = True) -> np.ndarray:
    """`quantize` of each row of `values` (blocks x values) with its exponent: the same integers (with
    `integers=False` still as float64, whole numbers in int32's range, for a caller that stores them as int32)."""
    if np.any(exponents == NO_EXPONENT):
        raise QuantizationError(NO_AGREED_EXPONENT)
    limit = INT32_MAX // world
    scaled = np.multiply(values, scales(world, exponents)[:, None], dtype=np.float64)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -limit, limit, out=scaled)
    return scaled.astype("<i4") if integers else scaled


def dequantize_blocks(ints: np.ndarray, exponents: np.ndarray, world: int, divisors: np.ndarray) -> np.ndarray:
    """`dequantize` of each row of `ints` with its exponent and divisor: the same floats."""
    return (ints.astype(np.float64) / (scales(world, exponents) * divisors)[:, None]).astype(np.float32)
