"""Files a profile or memory run writes besides records (traces, snapshots): one name per sweep point and per
rank, and traces kept apart from the results folder."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from stepscope.errors import UsageError


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


def check_trace_apart(trace: str | os.PathLike, paths: list[Path], out: str | os.PathLike | None, *,
                      plots: bool) -> None:
    """Refuse trace files that would be the results folder, contain it, or take a name the folder uses for
    its own files (`*.jsonl` records, which `stepscope show` reads; with --memory the `memory-*.png`
    timelines): the trace's own check passes while --out does not exist yet, and then one write fails or
    overwrites the other."""
    if out is None:
        return
    folder = Path(out).resolve()
    example = Path(out) / "trace.json"
    for path in paths:
        target = path.resolve()
        if target == folder or target in folder.parents:
            raise UsageError(f"--trace {trace} collides with the results folder --out {out}: name a trace file "
                             f"of its own (e.g. {example})")
        if target.parent == folder and (target.suffix == ".jsonl"
                                        or (plots and fnmatch.fnmatch(target.name, "memory-*.png"))):
            owned = "*.jsonl records" + (", memory-*.png timelines" if plots else "")
            raise UsageError(f"--trace {trace} would write {path}, a name the results folder --out {out} uses for "
                             f"its own files ({owned}): name the trace e.g. {example}")
