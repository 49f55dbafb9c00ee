"""Hand every event of a Kineto / Chrome trace file (`.json` or `.json.gz`) to a sink as a plain dict: the reader of
`stepscope trace --tally`, which reads fields the analysis does not (its own reader, `traces/read.py`, decodes only
what it uses).

Small files are parsed whole by orjson; files above `TraceConfig.stream_above_MiB` are parsed as a stream of
events by ijson, so memory grows with the sink's tables, not with the file. Every failure to read is one
UsageError line naming the file.
"""

from __future__ import annotations

import gc
import gzip
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from stepscope.errors import UsageError

Progress = Callable[[int], None]
"""Told the number of compressed bytes read so far."""


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def text_size(path: Path) -> int:
    """Bytes of JSON text in the file (a gzip file's footer holds its size modulo 4 GiB; a file that shrinks
    when unpacked beyond that is larger than the footer says, so the compressed size is the floor)."""
    size = path.stat().st_size
    if path.suffix != ".gz" or size < 4:
        return size
    with open(path, "rb") as handle:
        handle.seek(-4, os.SEEK_END)
        footer = struct.unpack("<I", handle.read(4))[0]
    return max(footer, size)


class CountingReader:
    """A binary file that tells `progress` how many (compressed) bytes were read."""

    def __init__(self, raw: BinaryIO, inner: BinaryIO, progress: Progress | None) -> None:
        self.raw, self.inner, self.progress = raw, inner, progress

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        if self.progress is not None:
            self.progress(self.raw.tell())
        return data


def read_events(path: str | os.PathLike, sink: Any, stream_above_MiB: float = 256.0,
                progress: Progress | None = None) -> dict[str, Any]:
    """Hand every event of a trace file to `sink.add(events)` (an iterable of event dicts; `sink.events` counts
    them), whole or streamed as `read_trace` does; returns the file's metadata (the top-level keys but the
    events). UsageError (one line) for a file that is not a complete trace."""
    path = Path(path)
    columns = sink
    collecting = gc.isenabled()
    # millions of small dicts and no cycles: the cyclic collector would only rescan them (about a third of the time)
    gc.disable()
    try:
        if text_size(path) > stream_above_MiB * 2**20:
            meta = _read_streaming(path, columns, progress)
        else:
            meta = _read_whole(path, columns, progress)
    except UsageError:
        raise
    except (OSError, EOFError, zlib.error, ValueError, TypeError, KeyError) as error:
        reason = "truncated or corrupt" if not isinstance(error, OSError) or "gzip" in str(error).lower() \
            else (error.strerror or str(error))
        raise UsageError(f"cannot read trace {path}: {reason} ({type(error).__name__})") from None
    finally:
        if collecting:
            gc.enable()
    return meta


def _read_whole(path: Path, columns: Any, progress: Progress | None) -> dict[str, Any]:
    import orjson

    with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
        data = orjson.loads(CountingReader(raw, handle, progress).read())
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UsageError(f"not a PyTorch profiler trace: {path} (no traceEvents list)")
    columns.add(data.pop("traceEvents"))
    return data


def _read_streaming(path: Path, columns: Any, progress: Progress | None) -> dict[str, Any]:
    import ijson

    try:
        with open(path, "rb") as raw, (gzip.open(raw) if path.suffix == ".gz" else raw) as handle:
            columns.add(ijson.items(CountingReader(raw, handle, progress), "traceEvents.item", use_float=True))
        meta = _head_meta(path)
        if "distributedInfo" not in meta:  # written after the events: a second pass that builds only that value
            with _open(path) as handle:
                meta["distributedInfo"] = next(ijson.items(handle, "distributedInfo", use_float=True), None)
    except ijson.JSONError:
        raise ValueError("incomplete JSON") from None
    if columns.events == 0:
        raise UsageError(f"not a PyTorch profiler trace: {path} (no events in a traceEvents list)")
    return meta


HEAD_BYTES = 1 << 22
"""Kineto writes its metadata (distributedInfo, deviceProperties) before the events: the first 4 MiB hold it."""


def _head_meta(path: Path) -> dict[str, Any]:
    """The top-level keys before `traceEvents`, parsed from the head of the file (the events are not read)."""
    import orjson

    with _open(path) as handle:
        head = handle.read(HEAD_BYTES)
    index = head.find(b'"traceEvents"')
    if index < 0:
        return {}
    text = head[:index].rstrip().rstrip(b",")
    try:
        meta = orjson.loads(text + b"}") if text.strip() != b"{" else {}
    except orjson.JSONDecodeError:
        meta = {}
    return meta if isinstance(meta, dict) else {}
