"""The expert GEMMs as one operation over all experts, in one of two row layouts of the expert buffer:

- `grouped_mm` (sorted layout): the T x k rows sorted by expert, group e being rows offsets[e-1]:offsets[e];
  `torch._grouped_mm` multiplies each group by its expert's matrix. A real grouped GEMM on Hopper-class GPUs
  (CUTLASS, bf16), with no padding and no host sync. Its rules, which this module keeps: offsets int32 on
  the device, every row stride a multiple of 16 bytes (K and M multiples of 8 in bf16), a contiguous gradient
  in backward, operands cast by hand (autocast does not cast them), and under torch.compile bf16 only (its meta
  function refuses other dtypes).
- `bmm` (padded layout): n_experts blocks of `per_expert` rows (the busiest expert's kept count, read on the
  host: one sync per layer), the unused rows of each block zero-weighted; one `torch.bmm` per matrix. Everywhere
  else: CPUs, fp32 and fp16 on GPUs, GPUs before sm_90, unaligned widths.

Why the padded bmm on a CPU although torch's CPU build has `_grouped_mm`: that one is a loop of one GEMM per
expert, each its own OpenMP parallel region, and on a 2-core machine shared with another busy process every
region waits for a time slice at its barrier. At the 32-expert shape of docs/moe.md (4,096 rows, 512 -> 512),
one up-projection took 512 ms as 32 GEMMs (the loop in Python: the same) against 59 ms as one padded bmm and
57 ms for the dense GEMM of the same FLOPs; on one thread, where no barrier waits, 42, 42, 45 and 39 ms. One
region per GEMM, like the dense model's, is what makes the MoE block hold up beside it on a CPU; the padding
(the busiest expert's rows over the mean, 1.15 at that shape) is the price.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GEMM_KINDS = ("grouped_mm", "bmm")
"""What `gemm_kind` may answer (tests and benchmarks force each with `force_gemm_kind`)."""
_FORCED: list[str] = []


def force_gemm_kind(kind: str | None) -> None:
    """Make `gemm_kind` answer `kind` (None: choose by device and dtype again); for tests and benchmarks."""
    if kind is not None and kind not in GEMM_KINDS:
        raise ValueError(f"unknown expert GEMM kind {kind!r}; known: {', '.join(GEMM_KINDS)}")
    _FORCED[:] = [kind] if kind is not None else []


def gemm_kind(device: torch.device, dtype: torch.dtype, widths: tuple[int, ...]) -> str:
    """`grouped_mm` where `torch._grouped_mm` is a real grouped GEMM (bf16 on sm_90 and later, 16-byte aligned
    rows of every width), else `bmm`; forcing (`force_gemm_kind`) wins."""
    if _FORCED:
        return _FORCED[0]
    if (device.type == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(device)[0] >= 9 and not any(width % 8 for width in widths)):
        return "grouped_mm"
    return "bmm"


@dataclass
class Layout:
    """How the rows of the expert buffer are laid out (see the module docstring)."""

    kind: str
    """grouped_mm (sorted) or bmm (padded)."""
    n_experts: int
    expert_of_row: torch.Tensor
    """(rows,) the expert of each row (for the experts' biases)."""
    offsets: torch.Tensor | None = None
    """grouped_mm: (n_experts,) int32 running ends of the groups."""
    per_expert: int = 0
    """bmm: rows of each expert's block."""

    @classmethod
    def sorted(cls, counts: torch.Tensor, expert_of_row: torch.Tensor) -> Layout:
        """Rows sorted by expert, `counts` (on the device) per expert: no host sync."""
        return cls("grouped_mm", counts.numel(), expert_of_row, offsets=counts.cumsum(0).to(torch.int32))

    @classmethod
    def padded(cls, n_experts: int, per_expert: int, device: torch.device) -> Layout:
        """`n_experts` blocks of `per_expert` rows."""
        rows = torch.arange(n_experts, device=device).repeat_interleave(per_expert)
        return cls("bmm", n_experts, rows, per_expert=per_expert)

    @property
    def rows(self) -> int:
        return self.expert_of_row.shape[0]


def expert_matmul(a: torch.Tensor, b: torch.Tensor, layout: Layout) -> torch.Tensor:
    """(rows, K) in `layout` x (n_experts, K, M) -> (rows, M): every row times its expert's matrix."""
    if layout.kind == "grouped_mm":
        assert layout.offsets is not None
        return _ContiguousGrad.apply(torch._grouped_mm(a, b, offs=layout.offsets))
    blocks = a.view(layout.n_experts, layout.per_expert, a.shape[1])
    return torch.bmm(blocks, b).view(layout.rows, b.shape[2])


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: `torch._grouped_mm`'s backward refuses the
    broadcast or strided gradients that a sum or a slice hands back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's context
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad.contiguous()
