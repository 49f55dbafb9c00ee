"""The category table: ATen ops, autograd nodes, CUDA kernel names and ranges, outermost match wins."""

import pytest

from stepscope.measure.categories import CATEGORIES, RULES, categorize, classify_chain, normalize_name


@pytest.mark.parametrize("name, category", [
    # ATen ops seen on CPU
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::linear", "matmul"),
    ("aten::matmul", "matmul"),
    ("aten::scaled_dot_product_attention", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::softmax", "softmax"), ("aten::_log_softmax", "softmax"), ("aten::_softmax_backward_data", "softmax"),
    ("aten::layer_norm", "normalization"), ("aten::native_layer_norm_backward", "normalization"),
    ("aten::rms_norm", "normalization"), ("aten::_fused_rms_norm", "normalization"),
    ("aten::add_", "elementwise"), ("aten::mul", "elementwise"), ("aten::silu_backward", "elementwise"),
    ("aten::masked_fill", "elementwise"), ("aten::gelu", "elementwise"),
    ("aten::sum", "reduction"), ("aten::mean", "reduction"), ("aten::nll_loss_forward", "reduction"),
    ("aten::copy_", "memory copy"), ("aten::_to_copy", "memory copy"), ("aten::cat", "memory copy"),
    ("aten::embedding", "memory copy"), ("aten::view", "memory copy"), ("aten::t", "memory copy"),
    ("aten::_foreach_add_", "optimizer"), ("Optimizer.step#AdamW.step", "optimizer"),
    ("Optimizer.zero_grad#AdamW.zero_grad", "optimizer"), ("aten::_fused_adamw_", "optimizer"),
    ("c10d::allreduce_", "communication"), ("nccl:all_reduce", "communication"), ("gloo:all_reduce", "communication"),
    ("_c10d_functional::all_gather_into_tensor", "communication"),
    # autograd nodes read as the op they differentiate
    ("autograd::engine::evaluate_function: MmBackward0", "matmul"), ("AddmmBackward0", "matmul"),
    ("SoftmaxBackward0", "softmax"), ("NativeLayerNormBackward0", "normalization"),
    ("MaskedFillBackward0", "elementwise"), ("UnsafeViewBackward0", "memory copy"), ("MeanBackward1", "reduction"),
    ("ScaledDotProductFlashAttentionForCpuBackward0", "attention"), ("EmbeddingBackward0", "memory copy"),
    ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "memory copy"),
    # CUDA kernel names
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)", "matmul"),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize160x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", "matmul"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>::Params)", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4>>(Flash_fwd_params)", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)",
     "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*)",
     "normalization"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1>>",
     "memory copy"),
    ("void at::native::elementwise_kernel<128, 2, "
     "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda>",
     "memory copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3>>",
     "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
     "reduction"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", "memory copy"), ("Memset (Device)", "memory copy"),
])
def test_names_map_to_their_category(name, category):
    assert categorize(name) == category


@pytest.mark.parametrize("name", ["stepscope.forward", "stepscope.backward", "ProfilerStep#3",
                                  "aten::cross_entropy_loss", "my_custom_kernel"])
def test_ranges_composites_and_unknown_names_have_no_rule(name):
    assert categorize(name) is None


def test_autograd_nodes_read_as_their_forward_op():
    assert normalize_name("autograd::engine::evaluate_function: NativeLayerNormBackward0") == "aten::native_layer_norm"
    assert normalize_name("TBackward0") == "aten::t"
    assert normalize_name("aten::mm") == "aten::mm"


def test_the_outermost_matching_op_of_a_chain_decides():
    # a copy inside a matmul is matmul work; a multiply inside a norm is normalization
    assert classify_chain(["stepscope.forward", "aten::linear", "aten::matmul", "aten::copy_"]) == ("matmul", 1)
    assert classify_chain(["stepscope.forward", "aten::rms_norm", "aten::mul"]) == ("normalization", 1)
    # everything in the optimizer phase is optimizer work, whatever the op
    assert classify_chain(["stepscope.optimizer", "aten::item"]) == ("optimizer", 0)
    # a kernel launched by an unknown op falls back to the kernel's own name
    assert classify_chain(["stepscope.backward", "my_op", "sm80_xmma_gemm_bf16"]) == ("matmul", 2)
    assert classify_chain(["stepscope.forward", "my_op"]) == ("other", 1)


def test_every_category_is_reachable_and_every_rule_names_a_known_category():
    assert {category for category, _, _ in RULES} == set(CATEGORIES) - {"other"}
