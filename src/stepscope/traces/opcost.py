"""FLOPs and bytes of one profiled op from the shapes the profiler recorded (`record_shapes=True`: `Input Dims`,
`Input type`, `Concrete Inputs` of a `cpu_op` event). The roofline (`traces/roofline.py`) sets them beside the time
of the kernels the op launched.

Conventions (the usual ones of roofline tools; every figure of `docs/traces.md` follows them):
- matmul family: a product of [m, k] by [k, n] is 2·m·k·n FLOPs per batch entry (a bias or `beta·C` adds no
  FLOPs); bytes = the operands (a bias or C too) and the result once (the ideal traffic; a kernel that re-reads
  tiles moves more);
- attention (SDPA and its flash / memory-efficient / cuDNN / CPU kernels): forward 4·B·H·Sq·Sk·D FLOPs (two
  products), halved when causal; backward 2.5 times the forward (the FlashAttention papers' count: five products,
  one of them the recomputed scores); bytes = q, k, v and the output (backward: also dO read, dq, dk, dv written);
- elementwise, normalisation, softmax and copies: bytes = every tensor input read once and an output the size of
  the largest input written once; FLOPs = `ELEMENTWISE[op]` per output element (a convention: these ops are memory
  bound, so their GB/s is the figure that matters).
Returns None for an op without a rule or without usable shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ITEM_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "c10::Float8_e4m3fn": 1,
              "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "long int": 8, "int": 4,
              "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}
PRECISION = {"float": "fp32", "double": "fp64", "c10::BFloat16": "bf16", "c10::Half": "fp16",
             "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
             "c10::Float8_e5m2fnuz": "fp8"}

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_scaled_mm", "aten::addmm_")
"""The matmul family: `gemm` rows of the roofline and its total line."""

# is_causal's position among each attention op's arguments (ATen's signatures), and where q and k are
ATTENTION_OPS: dict[str, tuple[int, int, int, bool]] = {
    # name: (q index, k index, is_causal index, backward)
    "aten::scaled_dot_product_attention": (0, 1, 5, False),
    "aten::_scaled_dot_product_flash_attention": (0, 1, 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 1, 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, 6, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, 11, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 2, 7, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, 14, True),
}

ELEMENTWISE: dict[str, float] = {
    # FLOPs per output element (a convention, see the module docstring)
    "aten::add": 1, "aten::add_": 1, "aten::sub": 1, "aten::sub_": 1, "aten::mul": 1, "aten::mul_": 1,
    "aten::div": 1, "aten::div_": 1, "aten::neg": 1, "aten::rsub": 1, "aten::addcmul_": 2, "aten::addcdiv_": 2,
    "aten::lerp_": 2, "aten::pow": 1, "aten::sqrt": 1, "aten::rsqrt": 1, "aten::exp": 1, "aten::sigmoid": 4,
    "aten::tanh": 4, "aten::relu": 1, "aten::relu_": 1, "aten::gelu": 8, "aten::silu": 4, "aten::silu_backward": 6,
    "aten::gelu_backward": 12, "aten::threshold_backward": 1, "aten::sigmoid_backward": 2, "aten::tanh_backward": 2,
    "aten::where": 1, "aten::clamp": 1, "aten::clamp_min": 1,
    "aten::copy_": 0, "aten::_to_copy": 0, "aten::clone": 0, "aten::fill_": 0, "aten::zero_": 0,
    "aten::native_layer_norm": 8, "aten::layer_norm": 8, "aten::native_layer_norm_backward": 16,
    "aten::rms_norm": 4, "aten::_fused_rms_norm": 4, "aten::_fused_rms_norm_backward": 8,
    "aten::_softmax": 5, "aten::softmax": 5, "aten::_log_softmax": 5, "aten::_softmax_backward_data": 4,
    "aten::_log_softmax_backward_data": 4, "aten::native_dropout": 2, "aten::embedding": 0,
}
NORMALIZATION = ("layer_norm", "rms_norm")
SOFTMAX = ("softmax",)


@dataclass(frozen=True)
class OpCost:
    """What the shapes say one call of an op does."""

    family: str
    """`gemm`, `attention`, `normalization`, `softmax` or `elementwise`."""
    flops: float
    bytes: float
    precision: str
    """`bf16`, `fp16`, `fp32`, `fp8`, `fp64` (the first tensor input's), or `other`."""
    shape: str
    """The tensor inputs' dimensions, e.g. `4096x768 @ 768x2304` (what the roofline groups by)."""


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], str]]:
    """(dims, type) of each tensor input (scalars and empty lists dropped)."""
    out = []
    for index, value in enumerate(dims):
        kind = types[index] if index < len(types) else ""
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value) and kind in ITEM_BYTES:
            out.append((value, kind))
    return out


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


def _label(tensors: list[tuple[list[int], str]], joiner: str = ", ") -> str:
    return joiner.join("x".join(map(str, shape)) for shape, _ in tensors)


def op_cost(name: str, dims: list[Any] | None, types: list[Any] | None,
            concrete: list[Any] | None = None) -> OpCost | None:
    """The FLOPs and bytes of one call (see the module docstring), or None."""
    if not dims or not types:
        return None
    if name in GEMM_OPS:
        return _gemm(name, _tensors(dims, types))
    if name in ATTENTION_OPS:
        return _attention(name, dims, types, concrete or [])
    per_element = ELEMENTWISE.get(name)
    if per_element is None:
        return None
    tensors = _tensors(dims, types)
    if not tensors:
        return None
    largest = max(_numel(shape) for shape, _ in tensors)
    read = sum(_numel(shape) * ITEM_BYTES[kind] for shape, kind in tensors)
    if name in ("aten::fill_", "aten::zero_"):  # writes only
        read = 0
    written = largest * ITEM_BYTES[tensors[0][1]]
    if name == "aten::embedding":  # reads the looked-up rows, not the whole table
        weight, index = tensors[0], tensors[-1]
        written = _numel(index[0]) * weight[0][-1] * ITEM_BYTES[weight[1]]
        read = written + _numel(index[0]) * ITEM_BYTES[index[1]]
    family = ("normalization" if any(w in name for w in NORMALIZATION)
              else "softmax" if any(w in name for w in SOFTMAX) else "elementwise")
    return OpCost(family, per_element * largest, float(read + written), PRECISION.get(tensors[0][1], "other"),
                  _label(tensors))


def _gemm(name: str, tensors: list[tuple[list[int], str]]) -> OpCost | None:
    inputs = tensors  # every tensor input is read once (a bias or C too)
    if name == "aten::linear":  # x [..., k], weight [n, k], bias [n]
        if len(tensors) < 2 or len(tensors[1][0]) != 2:
            return None
        x, w = tensors[0][0], tensors[1][0]
        m, k, n = _numel(x[:-1]), x[-1], w[0]
        if w[1] != k:
            return None
        batch, result = 1, m * n
    else:
        if name in ("aten::addmm", "aten::addmm_", "aten::baddbmm"):  # (C, A, B)
            tensors = tensors[1:] if len(tensors) >= 3 else tensors
        if len(tensors) < 2:
            return None
        a, b = tensors[0][0], tensors[1][0]
        a = [1, *a] if len(a) == 1 else a  # matmul's vector cases
        b = [*b, 1] if len(b) == 1 else b
        m, k, k2, n = a[-2], a[-1], b[-2], b[-1]
        if k != k2:
            return None
        batch = max(_numel(a[:-2]), _numel(b[:-2]))  # broadcast batch dimensions
        result = batch * m * n
    flops = 2.0 * batch * m * k * n
    kind = tensors[0][1]
    moved = sum(_numel(shape) * ITEM_BYTES[t] for shape, t in inputs[:3]) + result * ITEM_BYTES[kind]
    return OpCost("gemm", flops, float(moved), PRECISION.get(kind, "other"), _label(tensors[:2], " @ "))


def _attention(name: str, dims: list[Any], types: list[Any], concrete: list[Any]) -> OpCost | None:
    q_at, k_at, causal_at, backward = ATTENTION_OPS[name]
    if len(dims) <= k_at or not all(isinstance(dims[i], list) and len(dims[i]) == 4 for i in (q_at, k_at)):
        return None
    (b, h, sq, d), (_, _, sk, _) = dims[q_at], dims[k_at]
    kind = types[q_at] if q_at < len(types) else ""
    causal = causal_at < len(concrete) and str(concrete[causal_at]).lower() == "true"
    flops = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0)
    size = ITEM_BYTES.get(kind, 2)
    kv_heads = dims[k_at][1]
    q_bytes, kv_bytes = b * h * sq * d * size, b * kv_heads * sk * d * size
    moved = 2 * q_bytes + 2 * kv_bytes  # q, k, v read, output written
    if backward:
        flops *= 2.5
        moved = 4 * q_bytes + 4 * kv_bytes  # q, k, v, out, dO read; dq, dk, dv written
    label = f"{b}x{h}x{sq}x{d}" + (f" kv {kv_heads}x{sk}" if (kv_heads, sk) != (h, sq) else "") + (
        " causal" if causal else "")
    return OpCost("attention", flops, float(moved), PRECISION.get(kind, "other"), label)
