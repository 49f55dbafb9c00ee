"""The matrix ops `op-rates` times, in the shapes a model's training step runs them: one transformer layer's GEMMs
and the output layer's on one GPU of a tensor-parallel group (three passes each), one GPU's expert GEMMs, causal
attention of one layer's local heads, and n x n x n products. Torch-free: FLOPs as the performance model counts
them (`perfmodel/model/ops.py`; tests/measure/test_op_rates.py holds the two together)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepscope.errors import UsageError
from stepscope.spec import get_preset


@dataclass(frozen=True)
class MatrixOp:
    """One product of M x K by K x N (`groups` of them for grouped GEMMs, M rows each)."""

    family: str
    """dense | cube | moe | attention."""
    model: str
    """The model preset whose shapes these are (`-` for a cube)."""
    op: str
    """The op of the performance model: qkv, attn_out, mlp_up, mlp_down, logits, expert_up, ..."""
    direction: str
    """forward | input-grad | weight-grad (a GEMM's passes) | backward (attention)."""
    m: int
    k: int
    n: int
    groups: int = 1
    flops: float = 0.0
    """Model FLOPs (0: 2·groups·M·K·N)."""

    def __post_init__(self) -> None:
        if not self.flops:
            object.__setattr__(self, "flops", 2.0 * self.groups * self.m * self.k * self.n)


def dense_ops(model: str, tp: int, tokens: int) -> list[MatrixOp]:
    """The linear layers of one transformer layer and the output layer on one GPU of a TP group, 3 passes."""
    spec = get_preset(model)
    h, q, kv, f = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff
    up = (2 if spec.mlp == "swiglu" else 1) * f
    linears = {"qkv": (h, (q + 2 * kv) // tp), "attn_out": (q // tp, h), "mlp_up": (h, up // tp),
               "mlp_down": (f // tp, h), "logits": (h, spec.vocab_size // tp)}
    out = []
    for op, (k, n) in linears.items():
        out += [MatrixOp("dense", model, op, "forward", tokens, k, n),
                MatrixOp("dense", model, op, "input-grad", tokens, n, k),
                MatrixOp("dense", model, op, "weight-grad", n, tokens, k)]
    return out


def moe_ops(model: str, ep: int, tokens: int) -> list[MatrixOp]:
    """A GPU's expert GEMMs, forward, with its tokens' top-k copies spread evenly over its n_experts/ep experts."""
    spec = get_preset(model)
    local = spec.n_experts // ep
    rows = tokens * spec.experts_per_token // local
    up = (2 if spec.mlp == "swiglu" else 1) * spec.expert_d_ff
    return [MatrixOp("moe", model, "expert_up", "forward", rows, spec.d_model, up, local),
            MatrixOp("moe", model, "expert_down", "forward", rows, spec.expert_d_ff, spec.d_model, local)]


def attention_ops(model: str, tp: int, seq: int) -> list[MatrixOp]:
    """Causal attention of the layer's local heads for one sequence: model FLOPs as the performance model counts
    them (2·s²·d per head forward, half the square; backward 2.5x), m = s, k = head dim, n = heads."""
    spec = get_preset(model)
    heads, d = spec.n_heads // tp, spec.q_dim // spec.n_heads
    forward = 2.0 * seq * seq * d * heads
    return [MatrixOp("attention", model, "flash_attention", "forward", seq, d, heads, flops=forward),
            MatrixOp("attention", model, "flash_attention", "backward", seq, d, heads, flops=2.5 * forward)]


def cube_op(n: int) -> MatrixOp:
    """An n x n x n product."""
    return MatrixOp("cube", "-", "matmul", "forward", n, n, n)


def layout_ops(layout: str, build: Callable[[str, int, int], list[MatrixOp]], what: str) -> list[MatrixOp]:
    """The ops of one `model:parallel:tokens` layout (UsageError naming it when it is not one)."""
    parts = layout.split(":")
    try:
        if len(parts) != 3 or int(parts[1]) < 1 or int(parts[2]) < 1:
            raise ValueError(layout)
        return build(parts[0], int(parts[1]), int(parts[2]))
    except UsageError as error:
        raise UsageError(f"{what} layout {layout!r}: {error}") from None
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"{what} layout {layout!r} is not model:{'ep' if what == 'moe' else 'tp'}:"
                         f"{'seq' if what == 'sdpa' else 'tokens'} with positive integers") from None
