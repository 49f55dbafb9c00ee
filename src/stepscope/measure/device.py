"""Devices and precisions: resolve `auto`, synchronize, autocast contexts, support checks, CPU threads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from stepscope.errors import UsageError

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                                  "fp64": torch.float64}


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` -> cuda when a GPU is visible, else cpu; `cuda` without a GPU is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r} (use auto, cpu or cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device cuda requested but no CUDA GPU is available (use --device cpu)")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"device {name!r} is not supported (use auto, cpu or cuda)")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued device work; CPU ops are synchronous, so nothing to do there."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dtype_of(precision: str) -> torch.dtype:
    """torch dtype of fp32 | bf16 | fp16 | fp64 (UsageError otherwise)."""
    try:
        return DTYPES[precision]
    except KeyError:
        raise UsageError(f"unknown precision {precision!r}; known: {', '.join(DTYPES)}") from None


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for bf16/fp16; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype_of(precision))


def check_precision(device: torch.device, precision: str) -> None:
    """Raise a UsageError when `precision` cannot run on `device` (probed with a tiny autocast matmul)."""
    if precision == "fp8":
        raise UsageError("fp8 training is predicted (predict, plan, validate), not measured: stepscope measures "
                         "fp32, bf16 and fp16")
    dtype_of(precision)
    if precision == "fp32":
        return
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"bf16 is not supported on {torch.cuda.get_device_name(device)} (use fp16 or fp32)")
    try:
        with autocast(device, precision):
            x = torch.ones(4, 4, device=device)
            torch.nn.functional.linear(x, x).sum().item()
    except RuntimeError as error:
        raise UsageError(f"{precision} autocast is not supported on {device.type}: {error}".splitlines()[0]) from None


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from stepscope.host import cpu_model

    return cpu_model()


@contextlib.contextmanager
def cpu_threads(threads: int | None) -> Iterator[int]:
    """Run with `threads` intra-op CPU threads (None keeps PyTorch's default); yields the count in use."""
    previous = torch.get_num_threads()
    if threads is not None:
        if threads <= 0:
            raise UsageError(f"threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def is_out_of_memory(error: BaseException) -> bool:
    """True for CUDA OOM, Python MemoryError, the CPU allocator's failure and a tensor too large to have a size
    (`Storage size calculation overflowed`: no memory could hold it)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                                or "Storage size calculation overflowed" in text)


def release_memory(device: torch.device) -> None:
    """Free cached blocks after an OOM so the next sweep point starts clean."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
