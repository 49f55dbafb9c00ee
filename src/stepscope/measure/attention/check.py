"""The problem of one attention benchmark point and the correctness gate every implementation passes first.

`AttentionProblem` holds random q, k, v, dO of one point and, computed once, the fp64 reference of
`nn.attention_reference`. The check runs one forward (+ backward) of an implementation and measures the
relative error (max |x − ref| / max |ref|) of O, dQ, dK, dV. At long sequences only `check_rows`
evenly spaced query rows are checked: for the check dO is zero outside those rows, which makes the
reference's gradients exact while it only computes those rows (dQ, dK, dV are checked whole).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from stepscope.measure.attention.config import OWN_IMPLS, TOLERANCE, AttentionPoint
from stepscope.measure.device import DTYPES
from stepscope.nn.attention_reference import reference_forward_backward, relative_error

_REFERENCE_BLOCK_BYTES = 256 * 2 ** 20  # fp64 scores per block of reference rows


class AttentionProblem:
    """The random inputs of one point, and the fp64 reference the correctness check compares with."""

    def __init__(self, point: AttentionPoint, device: torch.device, *, seed: int, check_rows: int,
                 backward: bool) -> None:
        generator = torch.Generator().manual_seed(seed)
        shape = (point.batch, point.heads, point.seq, point.dim)
        dtype = DTYPES[point.dtype]
        self.q, self.k, self.v, self.grad_out = (torch.randn(shape, generator=generator).to(device, dtype)
                                                 for _ in range(4))
        for tensor in (self.q, self.k, self.v):
            tensor.requires_grad_(True)
        self.point, self.backward = point, backward
        self.rows = None
        self.check_grad_out = self.grad_out
        if point.seq > check_rows:
            self.rows = torch.linspace(0, point.seq - 1, check_rows, device=device).round().long().unique()
            keep = torch.zeros(point.seq, dtype=torch.bool, device=device)
            keep[self.rows] = True
            self.check_grad_out = self.grad_out * keep.view(-1, 1).to(self.grad_out.dtype)
        self._reference: dict[str, torch.Tensor] | None = None
        self._pytorch_errors: dict[str, float] | None = None

    def reference(self) -> dict[str, torch.Tensor]:
        if self._reference is None:
            block = max(1, _REFERENCE_BLOCK_BYTES // (8 * self.point.batch_heads * self.point.seq))
            with torch.no_grad():
                self._reference = reference_forward_backward(
                    self.q.detach(), self.k.detach(), self.v.detach(),
                    self.check_grad_out if self.backward else None, self.point.causal, rows=self.rows, block=block)
        return self._reference

    def pytorch_errors(self) -> dict[str, float]:
        """Errors of `F.scaled_dot_product_attention` on this problem (computed once): the yardstick of
        stepscope's own low-precision kernels."""
        if self._pytorch_errors is None:
            self._pytorch_errors = check_correctness(
                self, lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                               is_causal=causal))
        return self._pytorch_errors

    def tolerances(self, impl: str) -> dict[str, float]:
        """Accepted error per checked tensor for implementation `impl` (see TOLERANCE and OWN_IMPLS)."""
        fixed = TOLERANCE[self.point.dtype]
        names = ["err_out", *(["err_dq", "err_dk", "err_dv"] if self.backward else [])]
        if impl not in OWN_IMPLS or self.point.dtype == "fp32":
            return {name: fixed for name in names}
        # 2x PyTorch's own error; the fp32 gate as a floor where PyTorch happens to be almost exact
        return {name: max(2.0 * error, TOLERANCE["fp32"]) for name, error in self.pytorch_errors().items()}

    def clear_grads(self) -> None:
        self.q.grad = self.k.grad = self.v.grad = None

    def run(self, fn: Callable, grad_out: torch.Tensor | None, lap: Callable[[str], None] | None = None
            ) -> torch.Tensor:
        """One forward (and backward with `grad_out`); `lap(phase)` after each phase."""
        self.clear_grads()
        out = fn(self.q, self.k, self.v, self.point.causal)
        if lap:
            lap("fwd")
        if grad_out is not None:
            out.backward(grad_out)
            if lap:
                lap("bwd")
        return out


def check_correctness(problem: AttentionProblem, fn: Callable) -> dict[str, float]:
    """Relative errors of the output (checked rows) and, with a backward, of dQ, dK, dV."""
    out = problem.run(fn, problem.check_grad_out if problem.backward else None).detach()
    reference = problem.reference()
    checked = out if problem.rows is None else out.index_select(-2, problem.rows)
    errors = {"err_out": relative_error(checked, reference["out"])}
    if problem.backward:
        for name, tensor in (("dq", problem.q), ("dk", problem.k), ("dv", problem.v)):
            errors[f"err_{name}"] = relative_error(tensor.grad, reference[name])
    problem.clear_grads()
    return errors
