"""Every file a command writes besides its records is proven writable before any work starts, with one line
saying why not: the results folder, plots, traces, snapshots, a fitted system. No torch here."""

from __future__ import annotations

import os
from pathlib import Path

from stepscope.errors import UsageError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")

_CREATED: list[Path] = []
"""What the checks of this process created (folders, empty record files), in order: a refused command takes back
what is still empty (`remove_created`)."""


def make_folder(folder: Path) -> None:
    """`mkdir -p`, remembering the folders it creates (OSError as mkdir raises it)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    _CREATED.extend(reversed(missing))


def note_created(path: Path) -> None:
    """Remember a file a check created (taken back by `remove_created` while still empty)."""
    _CREATED.append(path)


def remove_created() -> None:
    """Remove what the checks created and nothing has filled since: empty files, then empty folders, the deepest
    first. The command line calls it when it refuses a command, so a refused command leaves nothing behind; a
    file or folder that holds anything (a finished point) stays."""
    for path in reversed(_CREATED):
        try:
            if path.is_file() and path.stat().st_size == 0:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        except OSError:
            pass  # gone already, or not ours to remove any more
    _CREATED.clear()


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
        make_folder(path.parent)
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
        make_folder(path)
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
