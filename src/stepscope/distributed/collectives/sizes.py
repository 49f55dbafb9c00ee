"""Message sizes for collective sweeps: parse `1MB,10MB,100MB` lists and `1K:1G:x4` / `1K:64K:+8K`
ranges, and print byte counts compactly.

Units follow nccl-tests' `-b/-e` parser: K, M, G (and T) are powers of 1024, with or without a
trailing B or iB (`1M` = `1MB` = `1MiB` = 1,048,576 bytes); a plain number is bytes.
"""

from __future__ import annotations

import re

from stepscope.errors import UsageError

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_BYTES = 1 << 50
"""Larger sizes than 1 PiB are typos, and their element counts would overflow the int64 that collectives take."""
MAX_POINTS = 256
"""More sizes than this in one sweep is almost surely a typo (`1:1G:+1`)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`"64K"` -> 65536 bytes; fractions allowed (`1.5M`), rounded down to whole bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"invalid size {text!r} (examples: 4096, 64K, 1MB, 1.5G)")
    size = int(float(match.group(1)) * UNITS[match.group(2).upper()])
    if size > MAX_BYTES:
        raise UsageError(f"size {text!r} is more than {MAX_BYTES // UNITS['T']:,} TiB, more than any buffer can hold")
    return size


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes and ranges `MIN:MAX[:xFACTOR|:+STEP]` (default factor 2), ascending order
    kept as given for lists, deduplicated."""
    sizes: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise UsageError(f"malformed size list {text!r} (expected comma-separated sizes or MIN:MAX:xF ranges)")
        sizes.extend(_parse_range(item) if ":" in item else [parse_size(item)])
        if len(sizes) > MAX_POINTS:
            raise UsageError(f"--sizes {text!r} gives more than {MAX_POINTS} sizes; use a larger step")
    unique = list(dict.fromkeys(sizes))
    if any(size <= 0 for size in unique):
        raise UsageError(f"sizes must be positive, got {text!r}")
    return unique


def _parse_range(item: str) -> list[int]:
    parts = item.split(":")
    if len(parts) not in (2, 3):
        raise UsageError(f"invalid size range {item!r} (expected MIN:MAX:xFACTOR or MIN:MAX:+STEP)")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    step = parts[2].strip() if len(parts) == 3 else "x2"
    if low <= 0 or high < low:
        raise UsageError(f"invalid size range {item!r}: need 0 < MIN <= MAX")
    out = []
    if step[:1] in ("x", "X", "*"):
        try:
            factor = float(step[1:])
        except ValueError:
            raise UsageError(f"invalid factor {step!r} in size range {item!r}") from None
        if factor <= 1:
            raise UsageError(f"the factor in size range {item!r} must be greater than 1")
        size = float(low)
        while size <= high * (1 + 1e-12) and len(out) <= MAX_POINTS:
            out.append(int(size))
            size *= factor
    elif step.startswith("+"):
        increment = parse_size(step[1:])
        if increment <= 0:
            raise UsageError(f"the step in size range {item!r} must be positive")
        size = low
        while size <= high and len(out) <= MAX_POINTS:
            out.append(size)
            size += increment
    else:
        raise UsageError(f"invalid step {step!r} in size range {item!r} (use xFACTOR or +STEP, e.g. x4 or +1M)")
    return out


def format_bytes(size: int) -> str:
    """Compact exact size: 1048576 -> '1M', 1536 -> '1536' (only exact multiples get a unit)."""
    for unit in ("T", "G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(int(size))
