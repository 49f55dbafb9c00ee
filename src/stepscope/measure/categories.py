"""The one place that says what kind of work an op or kernel is: matmul, attention, softmax, ...

Pure Python (no torch), table-driven. A name is matched against `RULES` top to bottom; the first rule
that matches gives the category. Names come from three worlds, all handled by the same table:

- ATen ops on CPU and CUDA (`aten::addmm`, `aten::_softmax`, ...);
- autograd nodes of the backward pass (`autograd::engine::evaluate_function: MmBackward0`): the node
  `MaskedFillBackward0` is read as the op it differentiates, `aten::masked_fill`, so one word list covers
  forward and backward;
- CUDA kernel names (`sm90_xmma_gemm_...`, `cutlass::Kernel<...>`, `ncclDevKernel_AllReduce...`), and
  ranges that other code marks with `record_function` (`Optimizer.step#AdamW.step`, `nccl:all_reduce`).

An op nested inside another is classified by the OUTERMOST op of its call chain that matches a rule
(see `classify_chain`): a copy inside `aten::linear` is matmul work, a multiply inside `aten::rms_norm` is
normalization, and every op inside `Optimizer.step` is optimizer work. That is why the table needs no
entry for low-level helpers such as `aten::empty` under a matmul.

"memory copy" means data movement and layout: copies, casts, concatenation, indexing, embedding lookups,
fills, and view ops (reshape, transpose: host time only, no bytes moved).

"moe" is everything a Mixture-of-Experts block does inside its `stepscope.moe.<piece>` ranges (`nn.moe`):
router, dispatch (tokens gathered per expert), experts (their GEMMs and activation), combine (the weighted
scatter back), shared (the shared experts); the backward of those ops too. `profile` splits it by piece.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CATEGORIES: tuple[str, ...] = ("matmul", "attention", "moe", "softmax", "normalization", "elementwise", "reduction",
                               "memory copy", "optimizer", "communication", "other")
"""Every category, in the order tables list them."""

EVALUATE_PREFIX = "autograd::engine::evaluate_function: "
_BACKWARD_NODE = re.compile(r"^([A-Z][A-Za-z0-9]*?)Backward\d*$")


def _aten(*words: str) -> str:
    """Regex for ATen ops by base name, allowing a leading `_` (private variant) and a trailing `_`
    (in-place), e.g. `mul` matches aten::mul, aten::mul_ and aten::_mul."""
    return r"^aten::_?(?:" + "|".join(words) + r")_?$"


# (category, regex searched case-insensitively, what it covers). Order matters: the first match wins,
# so specific families (communication, optimizer, fused attention) come before generic ones (gemm, copy).
RULES: tuple[tuple[str, str, str], ...] = (
    # ---- collectives (before "reduce"/"gather" words below catch them) --------------------------------
    ("communication", r"^(nccl|gloo|mpi|ucc):|^_?c10d(_functional)?::|record_param_comms|ncclDevKernel|ncclKernel",
     "c10d ops and functional collectives, ProcessGroup ranges (nccl:all_reduce), NCCL kernels"),
    # ---- optimizer: the whole stepscope optimizer phase, PyTorch's optimizer ranges and kernels ----------
    ("optimizer", r"^stepscope\.optimizer$", "everything inside the optimizer phase of a stepscope step"),
    ("optimizer", r"^Optimizer\.(step|zero_grad)#", "torch.optim step and zero_grad ranges"),
    ("optimizer", r"^aten::_foreach_|^aten::_fused_(adam|adamw|sgd|adagrad)|^aten::_amp_|multi_tensor_apply"
                  r"|Fused(Adam|SGD)|Adamw?Functor|LpMaxFunctor",
     "foreach/fused optimizer ops and kernels, AMP unscale"),
    # ---- Mixture-of-Experts: the ranges nn.moe puts around router, dispatch, experts, combine, shared ----
    ("moe", r"^stepscope\.moe\.", "everything inside a Mixture-of-Experts block's piece ranges"),
    # ---- fused attention (before gemm: fmha kernels carry cutlass/sm80 in their names) ----------------
    ("attention", r"scaled_dot_product|flash|fmha|efficient_attention|cudnn_attention|flex_attention|attention|attn",
     "SDPA and its flash / memory-efficient / cuDNN kernels, FlashAttention kernels and ranges"),
    # ---- normalization and softmax ---------------------------------------------------------------------
    ("normalization", r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|RowwiseMoments|GammaBeta"
                      r"|cuApply(Layer|RMS)Norm|cuComputeGradInput|cuComputePartGradGammaBeta",
     "LayerNorm/RMSNorm forward and backward, their CUDA kernels"),
    ("softmax", r"soft_?max", "softmax and log-softmax (the loss's softmax over the vocabulary too)"),
    # ---- matrix multiplies -----------------------------------------------------------------------------
    ("matmul", _aten("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot",
                     "einsum", "tensordot", "scaled_mm", "int_mm", "addmm_activation", "mkldnn_linear",
                     "mkldnn_matmul", "linear_backward", "convolution", "conv[123]d", "convolution_backward"),
     "ATen matrix multiplies (and convolutions)"),
    ("matmul", r"gemm|gemv|xmma|cutlass|^sm\d{2,3}_|_sm\d{2,3}_|^(ampere|volta|turing|hopper|blackwell)_|cublas"
               r"|nvjet|splitKreduce|wgmma|triton_tem_fused_.*mm",
     "cuBLAS/CUTLASS GEMM kernels, Triton matmul templates"),
    # ---- data movement and layout ----------------------------------------------------------------------
    ("memory copy", _aten("copy", "to_copy", "to", "clone", "contiguous", "cat", "stack", "index_select",
                          "embedding", "embedding_dense_backward", "embedding_backward", "gather", "scatter",
                          "scatter_add", "index", "index_put", "index_put_impl", "index_add", "masked_scatter",
                          "masked_select", "repeat", "repeat_interleave", "fill", "zero", "zeros", "zeros_like",
                          "ones", "ones_like", "full", "full_like", "empty", "empty_like", "empty_strided",
                          "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "resize",
                          "local_scalar_dense", "item", "tril", "triu", "arange", "constant_pad_nd", "pad",
                          "slice_backward", "select_backward", "index_select_backward", "lift_fresh",
                          "lift_fresh_copy", "unsafe_index", "roll", "flip", "narrow_copy", "copy_from",
                          "copy_from_and_resize", "type_as", "copy_slices"),
     "copies, casts, concatenation, indexing, embedding lookups, fills, tensor creation"),
    ("memory copy", _aten("view", "reshape", "reshape_alias", "unsafe_view", "as_strided", "transpose", "t",
                          "permute", "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as",
                          "detach", "alias", "split", "split_with_sizes", "chunk", "narrow", "slice", "select",
                          "unbind", "broadcast_tensors", "movedim", "swapaxes", "view_as", "result_type",
                          "resolve_conj", "resolve_neg", "numpy_t", "conj", "real", "imag", "view_as_real"),
     "view ops (no bytes moved; their time is host overhead)"),
    ("memory copy", r"^torch::autograd::AccumulateGrad$|^detach_?$|^CopySlices$",
     "storing (or adding) a parameter's gradient; autograd's view bookkeeping"),
    ("memory copy", r"^Memcpy|^Memset|memcpy|memset|direct_copy|copy_kernel|CatArrayBatchedCopy|index_select"
                    r"|indexSelect|index_elementwise|gather|scatter|embedding|FillFunctor|fill_kernel",
     "CUDA copies, memsets, cat/index/gather/embedding kernels"),
    # ---- reductions ------------------------------------------------------------------------------------
    ("reduction", _aten("sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "prod",
                        "argmax", "argmin", "std", "var", "var_mean", "std_mean", "all", "any", "cumsum",
                        "cumprod", "logsumexp", "nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss_backward",
                        "nll_loss2d_forward", "nll_loss2d_backward", "count_nonzero",
                        "topk", "sort", "sum_to_size", "aminmax"),
     "sums, means, max/min, norms, the loss's gather-and-average (nll_loss)"),
    ("reduction", r"reduce_kernel|Reduce|nll_loss|cub::|DeviceReduce|DeviceScan|triton_(red|per)_",
     "CUDA reduction kernels, Triton reductions"),
    # ---- elementwise -----------------------------------------------------------------------------------
    ("elementwise", _aten("add", "sub", "rsub", "mul", "div", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2",
                          "pow", "sqrt", "rsqrt", "reciprocal", "abs", "sign", "sgn", "sin", "cos", "tanh",
                          "sigmoid", "relu", "gelu", "silu", "mish", "softplus", "hardtanh", "leaky_relu", "elu",
                          "threshold", "threshold_backward", "gelu_backward", "silu_backward", "tanh_backward",
                          "sigmoid_backward", "where", "masked_fill", "clamp", "clamp_min", "clamp_max", "clip",
                          "lerp", "addcmul", "addcdiv", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                          "logical_and", "logical_or", "logical_not", "bitwise_not", "bitwise_and", "bitwise_or",
                          "dropout", "native_dropout", "native_dropout_backward", "bernoulli", "uniform", "normal",
                          "rand", "randn", "randint", "floor", "ceil", "round", "trunc", "erf", "erfinv", "outer",
                          "square", "isnan", "isinf", "isfinite", "nan_to_num", "true_divide", "floor_divide",
                          "remainder", "fmod", "atan2", "hypot", "xlogy", "copysign"),
     "pointwise math, activations and their backward, masks, random fills"),
    ("elementwise", r"elementwise_kernel|vectorized_elementwise|unrolled_elementwise|triton_poi_|cpp_fused"
                    r"|pointwise", "CUDA elementwise kernels, Inductor's fused pointwise kernels"),
)

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple((category, re.compile(pattern, re.IGNORECASE))
                                                           for category, pattern, _ in RULES)


def normalize_name(name: str) -> str:
    """The name the rules see: an autograd node is read as the ATen op it differentiates."""
    if name.startswith(EVALUATE_PREFIX):
        name = name[len(EVALUATE_PREFIX):]
    match = _BACKWARD_NODE.match(name)
    if match:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()
        return f"aten::{snake}"
    return name


def is_autograd_node(name: str) -> bool:
    """True for a backward-pass node (`...evaluate_function: XBackward0` or `XBackward0`)."""
    if name.startswith(EVALUATE_PREFIX):
        return True
    return bool(_BACKWARD_NODE.match(name))


def categorize(name: str) -> str | None:
    """The category of one op, kernel or range name by itself, or None when no rule matches."""
    normalized = normalize_name(name)
    for category, pattern in _COMPILED:
        if pattern.search(normalized):
            return category
    return None


def classify_chain(names: Sequence[str]) -> tuple[str, int]:
    """(category, index) for a call chain given outermost first: the first name that matches a rule
    decides, and `index` says which one (the op the work is attributed to). ("other", last) if none."""
    for index, name in enumerate(names):
        category = categorize(name)
        if category is not None:
            return category, index
    return "other", len(names) - 1
