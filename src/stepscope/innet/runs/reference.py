"""Reference inputs and checks: every rank can regenerate every rank's input, so each result is checked
locally against an exact (float64) reduction, within the quantization bound.

Bound per element of a float block (sum): contributors * 0.5 / f with f = INT32_MAX / (n * 2**e), e the
block's shared exponent, plus float32 rounding of the result (|ref| * 2**-23); an average divides both by
the contributors. int32 sums must be exact. Blocks completed without every rank (fastest-K) are not
comparable with the all-rank reference and are reported as unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.innet.wire.quantize import block_exponents, error_bound


def reference_input(seed: int, rank: int, numel: int, dtype: str, op_index: int = 0) -> np.ndarray:
    """Rank `rank`'s deterministic input of the `op_index`-th op (`dtype` fp32: normal; int32: in +-2**20)."""
    rng = np.random.default_rng([seed, rank, numel, op_index])
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, numel, dtype=np.int32)
    if dtype != "fp32":  # a misspelt dtype must not quietly become floats
        raise ValueError(f"dtype must be fp32 or int32, not {dtype!r}")
    return rng.standard_normal(numel).astype(np.float32)


@dataclass
class CheckResult:
    """Elements compared, wrong ones, and elements skipped because their block lacked a rank."""

    checked: int = 0
    wrong: int = 0
    unchecked: int = 0
    max_abs_error: float = 0.0

    def add(self, other: CheckResult) -> None:
        self.checked += other.checked
        self.wrong += other.wrong
        self.unchecked += other.unchecked
        self.max_abs_error = max(self.max_abs_error, other.max_abs_error)


def check_result(result: np.ndarray, inputs: list[np.ndarray], *, values_per_packet: int, average: bool,
                 contributors: np.ndarray | None = None) -> CheckResult:
    """Compare an all-reduce result with the float64 reduction of every rank's input."""
    world, k = len(inputs), values_per_packet
    stacked = np.stack([x.astype(np.float64) if x.dtype != np.int32 else x.astype(np.int64) for x in inputs])
    exact = stacked.sum(axis=0)
    full = np.ones(len(result), dtype=bool)
    if contributors is not None:
        full = np.repeat(contributors >= world, k)[:len(result)]
    out = CheckResult(unchecked=int((~full).sum()))
    if result.dtype == np.int32:
        wrapped = ((exact + 2**31) % 2**32 - 2**31).astype(np.int64)  # the switch adds with int32 wrap-around
        if average:  # integer division toward zero by the count (full blocks: every rank contributed)
            wrapped = np.sign(wrapped) * (np.abs(wrapped) // world)
        wrong = (result.astype(np.int64) != wrapped) & full
        out.checked, out.wrong = int(full.sum()), int(wrong.sum())
        return out
    expected = exact / world if average else exact
    exponents = block_exponents(np.max(np.abs(np.stack(inputs)), axis=0), k).astype(np.int64)
    bound_per_block = np.array([error_bound(world, int(e), world, average) for e in exponents])
    bound = np.repeat(bound_per_block, k)[:len(result)] + np.abs(expected) * 2.0**-23 + 1e-30
    error = np.abs(result.astype(np.float64) - expected)
    wrong = (error > bound) & full
    out.checked, out.wrong = int(full.sum()), int(wrong.sum())
    out.max_abs_error = float(error[full].max()) if full.any() else 0.0
    return out
