"""Decode the events of a Kineto trace into typed structs holding only the fields the analysis uses, a block of
the file at a time, so memory stays bounded whatever the file's size.

msgspec decodes each block straight into `Event` structs and skips every other field without building it (a
whole-file `orjson.loads` builds every dict and string of every event: about 8 bytes of Python objects per byte of
JSON). The blocks are cut at event boundaries found with numpy: the structural characters `{ } [ ]` outside
strings (a quote preceded by an odd number of backslashes is inside a string), depth counted from the
`traceEvents` array. Metadata keys before the array are parsed from the head; keys after it from the tail.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec
import numpy as np

BLOCK_BYTES = 1 << 24
"""Bytes read and decoded at a time (16 MiB: the peak holds about two blocks and their structs)."""
ARRAY_KEY = b'"traceEvents"'


class Args(msgspec.Struct):
    """The `args` fields the analysis reads (Kineto's names). Loosely typed: a malformed value is the reader's
    to refuse or skip (`read._int64`), never a failed decode of the whole block."""

    stream: Any = None
    correlation: Any = None
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    wait_on_stream: Any = None
    wait_on_record: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")


class Event(msgspec.Struct):
    """One trace event: only what the analysis reads."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    ts: Any = 0.0
    dur: Any = None
    tid: Any = 0
    args: Args | None = None


_DECODER = msgspec.json.Decoder(list[Event])
_OPEN, _CLOSE, _OPEN_LIST, _CLOSE_LIST, _QUOTE, _BACKSLASH = 123, 125, 91, 93, 34, 92


def _quotes(data: np.ndarray) -> np.ndarray:
    """Positions of the quotes that open or close a string (escaped ones left out)."""
    quotes = np.flatnonzero(data == _QUOTE)
    maybe = quotes[(quotes > 0) & (data[np.maximum(quotes - 1, 0)] == _BACKSLASH)]
    if not len(maybe):
        return quotes
    escaped = set()
    for position in maybe.tolist():  # rare: count the run of backslashes before the quote
        run = 0
        while position - run - 1 >= 0 and data[position - run - 1] == _BACKSLASH:
            run += 1
        if run % 2:
            escaped.add(position)
    return np.array([q for q in quotes.tolist() if q not in escaped], np.int64)


def split_events(block: bytes) -> tuple[int, int]:
    """(end of the last complete event, position of the `]` closing the array or -1), in a block starting inside
    the traceEvents array outside any event."""
    data = np.frombuffer(block, np.uint8)
    quotes = _quotes(data)
    marks = np.flatnonzero((data == _OPEN) | (data == _CLOSE) | (data == _OPEN_LIST) | (data == _CLOSE_LIST))
    marks = marks[np.searchsorted(quotes, marks) % 2 == 0]  # outside strings
    chars = data[marks]
    depth = np.cumsum(np.where((chars == _OPEN) | (chars == _OPEN_LIST), 1, -1))
    closed = np.flatnonzero(depth < 0)
    close = int(marks[closed[0]]) if len(closed) else -1
    ends = marks[(depth == 0) & (chars == _CLOSE)]
    if close >= 0:
        ends = ends[ends < close]
    return (int(ends[-1]) if len(ends) else -1), close


def iter_events(handle: BinaryIO, meta: dict[str, Any]) -> Iterator[list[Event]]:
    """Lists of events, a block at a time; `meta` receives the top-level keys other than the events. ValueError for
    a file that is not a complete `{"traceEvents": [...]}` document."""
    head = b""
    while (at := head.find(ARRAY_KEY)) < 0:
        more = handle.read(BLOCK_BYTES)
        if not more:
            raise ValueError("no traceEvents")
        head += more
    bracket = head.find(b"[", at + len(ARRAY_KEY))
    while bracket < 0:
        more = handle.read(BLOCK_BYTES)
        if not more:
            raise ValueError("no traceEvents list")
        head += more
        bracket = head.find(b"[", at + len(ARRAY_KEY))
    if head[at + len(ARRAY_KEY):bracket].strip() != b":":
        raise ValueError("traceEvents is not a list")
    before = head[:at].strip().rstrip(b",")
    if before.strip() != b"{":
        meta.update(_object(before + b"}"))
    carry = head[bracket + 1:]
    while True:
        more = handle.read(BLOCK_BYTES)
        block = carry + more
        end, close = split_events(block)
        if end >= 0:
            yield _DECODER.decode(b"[" + block[:end + 1].lstrip(b", \t\r\n") + b"]")
        if close >= 0:
            tail = block[close + 1:] + handle.read()
            rest = tail.strip()
            if not rest.endswith(b"}"):
                raise ValueError("incomplete JSON")
            if rest.startswith(b","):
                meta.update(_object(b"{" + rest[1:]))
            return
        if not more:
            raise ValueError("incomplete JSON")
        carry = block[end + 1:] if end >= 0 else block


def _object(text: bytes) -> dict[str, Any]:
    value = msgspec.json.decode(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value
