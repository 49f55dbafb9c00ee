"""The expert GEMMs as one grouped operation: rows sorted by expert, group g is rows offsets[g-1]:offsets[g],
each group multiplied by its own matrix, `(N, K) x (G, K, M) -> (N, M)`.

Two implementations behind `grouped_mm`, chosen per device and dtype by `grouped_mm_kind`:
- `torch._grouped_mm`: a real grouped GEMM on Hopper-class GPUs (CUTLASS, bf16), and in torch's CPU build a
  loop of GEMMs in C++ over row slices (fp32 and bf16; no copies). Its rules, which this module keeps: offsets
  int32 on the device (no host sync), every row stride a multiple of 16 bytes (so K and M multiples of 8 in
  bf16, 4 in fp32), a contiguous gradient in backward, operands cast by hand (autocast does not cast them), and
  under torch.compile only bf16 (its meta function refuses other dtypes).
- `loop`: one `torch.mm` per group on a row slice, written into one preallocated output (forward and backward),
  for everything else (older torch, fp32 on a GPU, GPUs before sm_90, unaligned widths). It needs the group
  sizes on the host: one synchronisation per `Groups`, shared by every GEMM of the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GROUPED_MM_KINDS = ("grouped_mm", "loop")
"""What `grouped_mm_kind` may answer (tests force each with `force_grouped_mm_kind`)."""
_FORCED: list[str] = []


@dataclass
class Groups:
    """Row groups of a matrix sorted by expert: the counts on the device, their running sums as int32 offsets
    (what `torch._grouped_mm` takes), and the sizes on the host when a loop needs them (read once)."""

    counts: torch.Tensor
    """(G,) rows per group, on the device."""
    offsets: torch.Tensor = field(init=False)
    """(G,) int32 end of each group."""
    _sizes: list[int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.offsets = self.counts.cumsum(0).to(torch.int32)

    @classmethod
    def of_sizes(cls, sizes: list[int], device: torch.device) -> Groups:
        """Groups whose sizes the host knows already (no synchronisation when a loop reads them)."""
        groups = cls(torch.tensor(sizes, dtype=torch.long).to(device))
        groups._sizes = list(sizes)
        return groups

    def sizes(self) -> list[int]:
        """Rows per group on the host (one device-to-host copy, the first time only)."""
        if self._sizes is None:
            self._sizes = self.counts.tolist()
        return self._sizes


def force_grouped_mm_kind(kind: str | None) -> None:
    """Make `grouped_mm_kind` answer `kind` (None: choose by device and dtype again); for tests and benchmarks."""
    if kind is not None and kind not in GROUPED_MM_KINDS:
        raise ValueError(f"unknown grouped GEMM kind {kind!r}; known: {', '.join(GROUPED_MM_KINDS)}")
    _FORCED[:] = [kind] if kind is not None else []


def grouped_mm_kind(device: torch.device, dtype: torch.dtype, widths: tuple[int, ...]) -> str:
    """`grouped_mm` where `torch._grouped_mm` runs for this device, dtype and row widths, else `loop`."""
    if _FORCED:
        return _FORCED[0]
    if not hasattr(torch, "_grouped_mm") or any(width * _itemsize(dtype) % 16 for width in widths):
        return "loop"
    if device.type == "cuda":
        # the CUTLASS kernel: bf16 on sm_90 (H100, H200) and later
        return "grouped_mm" if dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] >= 9 \
            else "loop"
    if device.type == "cpu":
        if dtype == torch.bfloat16:
            return "grouped_mm"
        # fp32 runs eagerly, but the meta function torch.compile traces with accepts bf16 only
        return "grouped_mm" if dtype == torch.float32 and not torch.compiler.is_compiling() else "loop"
    return "loop"


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def grouped_mm(a: torch.Tensor, b: torch.Tensor, groups: Groups) -> torch.Tensor:
    """(N, K) rows sorted by group x (G, K, M) -> (N, M); every row of `a` belongs to a group
    (offsets[-1] == N)."""
    if grouped_mm_kind(a.device, a.dtype, (a.shape[1], b.shape[2])) == "grouped_mm":
        return _ContiguousGrad.apply(torch._grouped_mm(a, b, offs=groups.offsets))
    return _LoopMM.apply(a, b, groups)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: `torch._grouped_mm`'s backward refuses the
    broadcast or strided gradients that a sum or a slice hands back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's context
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad.contiguous()


class _LoopMM(torch.autograd.Function):
    """One `torch.mm` per group into slices of one output (no concatenation, no zero-filled partial
    gradients); the backward multiplies the same slices again."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, groups: Groups) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(a, b)
        ctx.groups = groups
        out = a.new_empty(a.shape[0], b.shape[2])
        for g, (start, stop) in enumerate(_bounds(groups)):
            if stop > start:
                torch.mm(a[start:stop], b[g], out=out[start:stop])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:  # noqa: ANN001
        a, b = ctx.saved_tensors
        grad_a = a.new_empty(a.shape) if ctx.needs_input_grad[0] else None
        grad_b = torch.empty_like(b) if ctx.needs_input_grad[1] else None
        for g, (start, stop) in enumerate(_bounds(ctx.groups)):
            if stop == start:
                if grad_b is not None:
                    grad_b[g].zero_()  # an expert without rows: no gradient (zero-filling all of grad_b costs a pass)
                continue
            if grad_a is not None:
                torch.mm(grad[start:stop], b[g].t(), out=grad_a[start:stop])
            if grad_b is not None:
                torch.mm(a[start:stop].t(), grad[start:stop], out=grad_b[g])
        return grad_a, grad_b, None


def _bounds(groups: Groups) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for size in groups.sizes():
        bounds.append((start, start + size))
        start += size
    return bounds
