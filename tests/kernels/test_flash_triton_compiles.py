"""The Triton kernels compile for a Hopper GPU (sm_90) on this CPU machine.

The other kernel tests run the kernels under Triton's interpreter, which accepts Python the GPU compiler
refuses: a plain float global read inside a kernel passed every interpreter test and failed to compile on
the first real GPU (an H200). Triton's compiler needs no GPU to build a cubin for a named target, so every
kernel, causal or not and with ragged or even key tiles, is compiled here (bf16, head dim 64, one tile
configuration), in a fresh interpreter with TRITON_INTERPRET unset (the test session imported the kernels for
the interpreter).
"""

import os
import subprocess
import sys

import pytest

COMPILE_ALL = r"""
import itertools
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from stepscope.kernels import flash_triton_kernels as k

POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "dO": "*bf16", "dQ": "*bf16", "dK": "*bf16",
            "dV": "*bf16", "L": "*fp32", "Delta": "*fp32", "qk_scale": "fp32", "sm_scale": "fp32"}
for fn in (k.flash_fwd_kernel, k.flash_bwd_delta_kernel, k.flash_bwd_dkdv_kernel, k.flash_bwd_dq_kernel):
    for causal, even in itertools.product((True, False), (True, False)):
        fixed = dict(IS_CAUSAL=causal, HEAD_DIM=64, BLOCK_Q=128, BLOCK_K=64, EVEN_K=even, PRECISION="ieee")
        signature = {n: "constexpr" if n in fixed else POINTERS.get(n, "i32") for n in fn.arg_names}
        constants = {(i,): fixed[n] for i, n in enumerate(fn.arg_names) if n in fixed}
        compile(ASTSource(fn=fn, signature=signature, constexprs=constants), target=GPUTarget("cuda", 90, 32))
        print(fn.__name__, causal, even, "ok")
"""


def test_every_kernel_compiles_for_sm90(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("triton.backends.nvidia")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile, do not reuse an earlier session's cubins
    done = subprocess.run([sys.executable, "-c", COMPILE_ALL], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" ok") == 16
