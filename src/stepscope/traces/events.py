"""Decode the events of a Kineto trace into typed structs holding only the fields the analysis uses: a file of up
to `WHOLE_BYTES` of JSON at once, a larger one a block at a time, so memory stays bounded whatever the file's size.

msgspec decodes straight into `Event` structs and skips every other field without building it (a whole-file
`orjson.loads` builds every dict and string of every event: about 8 bytes of Python objects per byte of JSON). An
op's shapes stay raw JSON bytes (`msgspec.Raw`): they are only a key until a new one needs its cost.

Blocks are cut at the last event boundary, guessed as the last `},` followed by `{` (Kineto writes `},\\n  {`
between events) and proven by decoding: a cut inside a string or a nested object leaves unbalanced quotes or braces,
which no JSON list decodes. Where the guess fails, and in the last block (where the array closes), the boundaries
are found exactly with numpy: the structural characters `{ } [ ]` outside strings (a quote preceded by an odd
number of backslashes is inside a string), depth counted from the `traceEvents` array. Metadata keys before the
array are parsed from the head; keys after it from the tail.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO

import msgspec
import numpy as np

WHOLE_BYTES = 64 << 20
"""Files of up to this much JSON are decoded in one piece (no block boundaries to find); larger ones by blocks."""
BLOCK_BYTES = 1 << 24
"""Bytes read and decoded at a time above `WHOLE_BYTES` (16 MiB: the peak holds about two blocks and their
structs)."""
ARRAY_KEY = b'"traceEvents"'
META_KEYS = ("distributedInfo", "deviceProperties")
"""The top-level keys the analysis reads (rank and world size; the device's name)."""
NO_RAW = msgspec.Raw(b"")
GUESSES = 3
"""Guessed cuts tried per block before the exact search."""


Int64 = Annotated[int, msgspec.Meta(ge=-2**63, le=2**63 - 1)]


class Args(msgspec.Struct, gc=False):
    """The `args` fields the analysis reads (Kineto's names)."""

    stream: Int64 | None = None
    correlation: Int64 | None = None
    dims: msgspec.Raw = msgspec.field(default=NO_RAW, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=NO_RAW, name="Concrete Inputs")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    wait_on_stream: Any = None
    wait_on_record: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")


class Event(msgspec.Struct, gc=False):
    """One trace event: only what the analysis reads, of the types Kineto writes. A block where some event has
    other types is decoded loosely (`_LooseEvent`) and made into these (`_clean`)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float | None = None
    tid: Any = 0
    args: Args | None = None


class _LooseArgs(Args, gc=False):
    """`Args` whose stream and correlation may be of any type (checked one by one in `_clean`)."""

    stream: Any = None
    correlation: Any = None


class _LooseEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = ""
    ts: Any = 0.0
    dur: Any = None
    tid: Any = 0
    args: _LooseArgs | None = None


class _Document(msgspec.Struct):
    traceEvents: list[Event]
    distributedInfo: Any = None
    deviceProperties: Any = None


class _LooseDocument(msgspec.Struct):
    traceEvents: list[_LooseEvent]
    distributedInfo: Any = None
    deviceProperties: Any = None


_EVENTS, _LOOSE = msgspec.json.Decoder(list[Event]), msgspec.json.Decoder(list[_LooseEvent])
_DOCUMENT, _LOOSE_DOCUMENT = msgspec.json.Decoder(_Document), msgspec.json.Decoder(_LooseDocument)
_OPEN, _CLOSE, _OPEN_LIST, _CLOSE_LIST, _QUOTE, _BACKSLASH = 123, 125, 91, 93, 34, 92
_SKIPPED = Event()
"""Stands for an event the analysis cannot use (a timestamp that is no number ...), so the events still count."""


def int64(value: Any, default: int | None = None) -> int | None:
    """`value` as a signed 64-bit integer (an unsigned 64-bit one wraps, as the C++ that wrote it meant: 2^64 − 1
    is −1), or `default` when it is not a number or does not fit."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if 2**63 <= number < 2**64:
        number -= 2**64
    return number if -2**63 <= number < 2**63 else default


def decode_events(text: bytes) -> list[Event]:
    """The events of a JSON list (msgspec.DecodeError: it is not one)."""
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:
        return _clean(_LOOSE.decode(text))


def _clean(events: list[_LooseEvent]) -> list[Event]:
    """Loosely decoded events as `Event`s: a complete event whose times are no numbers is `_SKIPPED`; a name that
    is no text becomes one; a stream or correlation id becomes a 64-bit integer (None: not a number)."""
    out = []
    for e in events:
        if e.ph != "X" or e.dur is None or e.ts.__class__ not in (int, float) or e.dur.__class__ not in (int, float):
            out.append(_SKIPPED)
            continue
        a = e.args
        args = None if a is None else Args(
            None if a.stream is None else int64(a.stream), None if a.correlation is None else int64(a.correlation, -1),
            a.dims, a.types, a.concrete, a.in_nelems, a.group_size, a.dtype, a.wait_on_stream, a.wait_on_record)
        out.append(Event("X", e.cat if e.cat.__class__ is str else "", e.name if e.name.__class__ is str else
                         "" if e.name is None else str(e.name), float(e.ts), float(e.dur), e.tid, args))
    return out


def raw_value(raw: msgspec.Raw) -> Any:
    """The JSON value of a raw field (None where the event has none)."""
    return msgspec.json.decode(raw) if len(raw) else None


def iter_events(handle: BinaryIO, meta: dict[str, Any]) -> Iterator[list[Event]]:
    """Lists of events, the whole file's or a block's at a time; `meta` receives the top-level `META_KEYS`.
    ValueError for a file that is not a complete `{"traceEvents": [...]}` document."""
    head = handle.read(WHOLE_BYTES + 1)
    if len(head) <= WHOLE_BYTES:
        yield _whole(head, meta)
        return
    yield from _pieces(handle, head, meta, prove=True)


def iter_texts(handle: BinaryIO, meta: dict[str, Any]) -> Iterator[bytes]:
    """The events as JSON lists (`[...]`) a block at a time, for workers to decode: cut at guessed boundaries left
    unproven (a wrong guess makes a block that does not decode; `decode` then says so) and exactly in the last
    block. ValueError for a file that is not a complete `{"traceEvents": [...]}` document."""
    yield from _pieces(handle, handle.read(BLOCK_BYTES), meta, prove=False)


def decode(text: bytes) -> list[Event] | None:
    """The events of one of `iter_texts`'s lists (None: it is not one, a guessed cut was wrong)."""
    try:
        return decode_events(text)
    except msgspec.DecodeError:
        return None


def _whole(text: bytes, meta: dict[str, Any]) -> list[Event]:
    try:
        document = _DOCUMENT.decode(text)
    except msgspec.ValidationError:
        try:
            document = _LOOSE_DOCUMENT.decode(text)
        except msgspec.ValidationError as error:  # JSON, but not a trace: no traceEvents list at the top
            if str(error).endswith("at `$`") or "`traceEvents`" in str(error).split(" - at ")[0]:
                raise ValueError("no traceEvents list") from None
            raise
        document.traceEvents = _clean(document.traceEvents)
    meta.update({k: getattr(document, k) for k in META_KEYS if getattr(document, k) is not None})
    return document.traceEvents


def _pieces(handle: BinaryIO, head: bytes, meta: dict[str, Any], prove: bool) -> Iterator[Any]:
    """The events after `head` a block at a time: decoded lists (`prove`: each guessed cut proven by decoding)
    or JSON texts (unproven guesses)."""
    block = _array_start(handle, head, meta)
    while True:
        more = handle.read(BLOCK_BYTES)
        block += more
        if more:  # not the last block: the array goes on after it, a guessed cut is enough
            end, events = _guessed_cut(block, prove)
            if end >= 0:
                yield events if prove else _listed(block, end)
                block = block[end + 1:]
                continue
        end, close = split_events(block)
        if end >= 0:
            yield decode_events(_listed(block, end)) if prove else _listed(block, end)
        if close >= 0:
            rest = (block[close + 1:] + handle.read()).strip()
            if not rest.endswith(b"}"):
                raise ValueError("incomplete JSON")
            if rest.startswith(b","):
                _keep_meta(meta, b"{" + rest[1:])
            return
        if not more:
            raise ValueError("incomplete JSON")
        block = block[end + 1:] if end >= 0 else block


def _array_start(handle: BinaryIO, head: bytes, meta: dict[str, Any]) -> bytes:
    """What follows the `[` opening the traceEvents array (read on until it is found); the keys before it go to
    `meta`."""
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
        _keep_meta(meta, before + b"}")
    return head[bracket + 1:]


_SEPARATORS = b", \t\r\n"


def _listed(block: bytes, end: int) -> bytes:
    """`[` + the block's events up to `end` (the leading comma and blanks left out) + `]`, copied once."""
    start = 0
    while start <= end and block[start] in _SEPARATORS:
        start += 1
    return b"".join((b"[", memoryview(block)[start:end + 1], b"]"))


def _guessed_cut(block: bytes, prove: bool) -> tuple[int, list[Event] | None]:
    """The end of the block's events (not the last block): the last `},` followed by `{`, tried from the end;
    with `prove` only one whose events decode as a list, and those events. (−1, None): no guess."""
    end = len(block)
    for _ in range(GUESSES):
        end = block.rfind(b"},", 0, end)
        if end < 0:
            break
        if block[end + 2:end + 66].lstrip()[:1] != b"{":
            continue
        if not prove:
            return end, None
        try:
            return end, decode_events(_listed(block, end))
        except msgspec.DecodeError:
            continue
    return -1, None


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


def _keep_meta(meta: dict[str, Any], text: bytes) -> None:
    value = msgspec.json.decode(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    meta.update({k: value[k] for k in META_KEYS if k in value})
