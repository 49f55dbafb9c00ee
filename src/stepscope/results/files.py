"""Every file a command writes besides its records is proven writable before any work starts, with one line
saying why not: the results folder, plots, traces, snapshots, a fitted system. No torch here."""

from __future__ import annotations

import os
from pathlib import Path

from stepscope.errors import UsageError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_results_folder(out_dir: str | os.PathLike) -> Path:
    """Refuse an --out folder that is (or lies under) an existing file. Creates nothing."""
    return refuse_file_as_folder(out_dir, "results", "--out names a folder for the .jsonl records")


def refuse_file_as_folder(folder: str | os.PathLike, what: str, hint: str) -> Path:
    """Refuse a folder that is (or lies under) an existing file, saying so (mkdir would only say `File
    exists` or `Not a directory`): `cannot write <what> to <folder>: ... is a file, not a folder (<hint>)`."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "it" if existing == folder else str(existing)
        raise UsageError(f"cannot write {what} to {folder}: {where} is a file, not a folder ({hint})")
    return folder


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


def check_plot_file(path: str | os.PathLike) -> Path:
    """A plot's path: a format matplotlib writes (PNG, SVG, PDF), proven writable now (UsageError if not)."""
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot must end in {', '.join(PLOT_SUFFIXES)}, got {str(path)!r}")
    return check_writable_file(path, "the plot")
