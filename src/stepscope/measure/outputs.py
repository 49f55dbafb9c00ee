"""Files a profile or memory run writes besides records (traces, snapshots, plots): one name per sweep
point and per rank, and a writability check made before any work starts."""

from __future__ import annotations

import os
from pathlib import Path

from stepscope.errors import UsageError
from stepscope.results.store import refuse_file_as_folder


def with_suffix_tag(path: str | os.PathLike, tag: str) -> Path:
    """`trace.json` + `rank1` -> `trace.rank1.json` (the tag goes before the extension)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{tag}{path.suffix}")


def point_path(path: str | os.PathLike, index: int, count: int) -> Path:
    """One file per sweep point: unchanged for a single point, else `name.p<index>.ext`."""
    return Path(path) if count <= 1 else with_suffix_tag(path, f"p{index}")


def rank_path(path: str | os.PathLike) -> Path:
    """One file per rank when torch.distributed is initialized (`trace.rank1.json`), else unchanged."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return with_suffix_tag(path, f"rank{dist.get_rank()}")
    return Path(path)


def check_writable_file(path: str | os.PathLike, what: str) -> Path:
    """Create the folder and prove `path` can be written, leaving no empty file behind (UsageError if not)."""
    path = Path(path)
    existed = path.exists()
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as error:
        raise UsageError(f"cannot write {what} to {path}: {error.strerror or error}") from None
    if not existed:
        path.unlink()
    return path


def check_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create the folder and prove a file can be created in it (UsageError if not)."""
    path = Path(path)
    refuse_file_as_folder(path, what, f"give a folder: {what} are written into one")
    probe = path / f".stepscope-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise UsageError(f"cannot write {what} to {path}: {error.strerror or error}") from None
    return path
