"""The expert GEMMs as one operation over all experts, in one of two row layouts of the expert buffer:

- `grouped_mm` (sorted layout): the T x k rows sorted by expert, group e being rows offsets[e-1]:offsets[e];
  `torch._grouped_mm` multiplies each group by its expert's matrix. No padding and no host sync. On Hopper-class
  GPUs a real grouped GEMM (CUTLASS, bf16); in torch's CPU build a loop of one GEMM per expert in C++ (fp32,
  bf16, fp16). Its rules, which this module keeps: offsets int32 on the device, every row stride a multiple of
  16 bytes, a contiguous gradient in backward, operands cast by hand (autocast does not cast them), and under
  torch.compile bf16 only (its meta function refuses other dtypes).
- `bmm` (padded layout): n_experts blocks of `per_expert` rows (the busiest expert's kept count, read on the
  host: one sync per layer), the unused rows of each block zero-weighted; one `torch.bmm` per matrix.

Which one (`gemm_kind`): `grouped_mm` on sm_90 GPUs in bf16; `bmm` on other GPUs and dtypes; on a CPU `auto`,
decided per layer from the counts (`choose_layout`): the padded bmm while its rows stay within `PADDING_LIMIT`
of the rows needed, else the sorted rows (under torch.compile on a CPU, `grouped_mm` in bf16: a graph without
data-dependent shapes). Why not always one of them on a CPU (docs/moe.md has the runs):
- torch's CPU `_grouped_mm` runs one GEMM per expert, each its own OpenMP parallel region, and on a 2-core
  machine shared with another busy process every region waits for a time slice at its barrier: at 32 experts
  (4,096 rows, 512 -> 512) one up-projection took 512 ms as 32 GEMMs against 59 ms as one padded bmm and 57 ms
  for the dense GEMM of the same FLOPs (one thread, no barrier: 42, 45 and 39 ms);
- padding to the busiest expert multiplies the work by the routing's imbalance: 2.3x and 3.5x in the two MoE
  blocks of a freshly initialised 32-expert model on its own hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GEMM_KINDS = ("grouped_mm", "bmm")
"""The layouts (tests and benchmarks force one with `force_gemm_kind`)."""
PADDING_LIMIT = 1.25
"""On a CPU, the padded bmm runs while its rows (n_experts x the busiest expert's) are at most this many times the
rows of the sorted layout; beyond, the sorted rows' per-expert GEMMs cost less than the padding."""
_FORCED: list[str] = []


def force_gemm_kind(kind: str | None) -> None:
    """Make `gemm_kind` answer `kind` (None: choose by device and dtype again); for tests and benchmarks."""
    if kind is not None and kind not in GEMM_KINDS:
        raise ValueError(f"unknown expert GEMM kind {kind!r}; known: {', '.join(GEMM_KINDS)}")
    _FORCED[:] = [kind] if kind is not None else []


def gemm_kind(device: torch.device, dtype: torch.dtype, widths: tuple[int, ...]) -> str:
    """`grouped_mm`, `bmm`, or `auto` (decided per layer by `choose_layout`) for expert matrices of these widths
    (see the module docstring); forcing (`force_gemm_kind`) wins."""
    if _FORCED:
        return _FORCED[0]
    itemsize = torch.empty((), dtype=dtype).element_size()
    usable = hasattr(torch, "_grouped_mm") and not any(width * itemsize % 16 for width in widths)
    if device.type == "cuda":
        sm90 = torch.cuda.get_device_capability(device)[0] >= 9
        return "grouped_mm" if usable and sm90 and dtype == torch.bfloat16 else "bmm"
    if device.type != "cpu" or not usable:
        return "bmm"
    if torch.compiler.is_compiling():  # no data-dependent shapes in a graph; the meta function takes bf16 only
        return "grouped_mm" if dtype == torch.bfloat16 else "bmm"
    return "auto" if dtype in (torch.float32, torch.bfloat16, torch.float16) else "bmm"


def choose_layout(n_experts: int, per_expert: int, rows: int) -> str:
    """`auto`'s answer: `bmm` while n_experts x per_expert padded rows are within PADDING_LIMIT x `rows`."""
    return "bmm" if n_experts * per_expert <= PADDING_LIMIT * rows else "grouped_mm"


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
