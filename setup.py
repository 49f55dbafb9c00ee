"""The one thing pyproject.toml does not declare: the C fast path of the innet data path
(src/stepscope/innet/csrc/fastpath.h says what it holds), built at install time with the system's C compiler.
It is optional: where it cannot be built, installing still succeeds and the numpy path runs
(`stepscope.innet.wire.fastpath` says which path runs)."""

from setuptools import Extension, setup

CSRC = "src/stepscope/innet/csrc"

setup(ext_modules=[Extension(
    "stepscope.innet._fastpath",
    sources=[f"{CSRC}/{name}.c" for name in ("module", "mmsg_io", "switch_state", "switch_batch", "switch_drain",
                                             "worker_blocks", "worker_results")],
    depends=[f"{CSRC}/fastpath.h", f"{CSRC}/switch.h", f"{CSRC}/worker.h"],
    # exact float arithmetic (no fused multiply-adds, no fast-math: results equal numpy's to the bit); nothing
    # reads floating-point exception flags or errno, which lets the quantization loop vectorize
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fno-math-errno"],
    optional=True,
)])
