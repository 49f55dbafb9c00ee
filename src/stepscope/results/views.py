"""Views of rows (dicts): a rich table, CSV, Markdown or JSON Lines, all from the same rows.

Every command prints through `render`, and `stepscope show` turns stored records into rows with
`record_row`, so what a sweep printed and what `show` prints later look alike.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from stepscope.errors import UsageError

FORMATS = ("table", "json", "csv", "md")


def format_value(value: Any) -> str:
    """Numbers to 4 significant digits (thousands separated), None as '-', the rest as text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1e4:
            return f"{value:,.0f}"
        if magnitude >= 1e-3:
            return f"{value:.4g}"
        return f"{value:.3e}"
    return str(value)


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Union of the rows' keys in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def render(rows: Sequence[dict[str, Any]], *, fmt: str = "table", columns: Sequence[str] | None = None,
           title: str | None = None, width: int | None = None) -> str:
    """Render rows as `table` (rich), `csv`, `md` (GitHub Markdown) or `json` (one object per line)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    columns = list(columns) if columns else columns_of(rows)
    if fmt == "json":
        return "\n".join(json.dumps({c: row.get(c) for c in columns}, default=str) for row in rows)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
        return buffer.getvalue().rstrip("\n")
    cells = [[format_value(row.get(c)) for c in columns] for row in rows]
    if fmt == "md":
        lines = [f"**{title}**", ""] if title else []
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "|".join("---:" if _numeric(rows, c) else "---" for c in columns) + "|")
        # a `|` inside a cell (C++ kernel names, notes) would split it into two columns
        lines.extend("| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in cells)
        return "\n".join(lines)
    return _rich_table(rows, columns, cells, title, width)


def _numeric(rows: Sequence[dict[str, Any]], column: str) -> bool:
    values = [row.get(column) for row in rows if row.get(column) is not None]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def table_width() -> int:
    """The width tables fit: the terminal's (`COLUMNS` where set), 100 where output goes to a file or a pipe."""
    import shutil

    return shutil.get_terminal_size((TABLE_WIDTH, 24)).columns


TABLE_WIDTH = 100
"""Columns a table fits when there is no terminal to ask (pipes, files, the docs' outputs)."""
GAP = 3
"""Characters between two columns (padding and the space of the borderless box)."""


def _rich_table(rows: Sequence[dict[str, Any]], columns: list[str], cells: list[list[str]], title: str | None,
                width: int | None) -> str:
    """A table no wider than `width` (default: `table_width()`): when its columns do not fit, it is printed in
    parts, each with the label columns that tell the rows apart and as many others as fit; a cell wider than half
    the width folds."""
    limit = max(width or table_width(), 40)
    widths = [min(max([len(column), *(len(row[i]) for row in cells)]), limit // 2) for i, column in enumerate(columns)]
    numeric = [_numeric(rows, column) for column in columns]
    parts = _column_parts(widths, numeric, cells, limit)
    texts = []
    for n, part in enumerate(parts):
        part_title = title if n == 0 else "(continued)"
        texts.append(_one_table([columns[i] for i in part], [[row[i] for i in part] for row in cells],
                                [numeric[i] for i in part], [widths[i] for i in part], part_title))
    return "\n\n".join(texts)


def _column_parts(widths: list[int], numeric: list[bool], cells: list[list[str]], limit: int) -> list[list[int]]:
    """Column indexes of each part: the label columns in every part, then the other columns in order, as many per
    part as fit in `limit`. The labels are the fewest leading columns that tell every row apart (`model n_layers`
    of a sweep), else the leading text columns; within half the width either way."""
    if _width(list(range(len(widths))), widths) <= limit:
        return [list(range(len(widths)))]
    labels: list[int] = []
    for k in range(1, len(widths)):
        if _width(list(range(k)), widths) > limit // 2:
            break
        if len({tuple(row[:k]) for row in cells}) == len(cells):
            labels = list(range(k))
            break
    if not labels:
        for i, is_number in enumerate(numeric):
            if is_number or _width(labels + [i], widths) > limit // 2:
                break
            labels.append(i)
    parts: list[list[int]] = []
    current = list(labels)
    for i in range(len(labels), len(widths)):
        if len(current) > len(labels) and _width(current + [i], widths) > limit:
            parts.append(current)
            current = list(labels)
        current.append(i)
    parts.append(current)
    return parts


def _width(indexes: list[int], widths: list[int]) -> int:
    """Printed width of these columns: a leading space, the cells, the gaps between them."""
    return 1 + sum(widths[i] for i in indexes) + GAP * max(len(indexes) - 1, 0)


def _one_table(columns: list[str], cells: list[list[str]], numeric: list[bool], widths: list[int],
               title: str | None) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Text, not str: rich would read `[param|cuda]` (an op name) or `[/bold]` in a note as markup
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, is_number, column_width in zip(columns, numeric, widths, strict=True):
        table.add_column(Text(column), justify="right" if is_number else "left", overflow="fold",
                         max_width=column_width)
    for row_cells in cells:
        table.add_row(*(Text(cell) for cell in row_cells))
    buffer = io.StringIO()
    # a console exactly the table's width: rich neither wraps the table nor cuts its header rule short
    Console(file=buffer, width=_width(list(range(len(columns))), widths) + 1, no_color=True,
            highlight=False).print(table)
    text = "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())
    # the title on its own line, whole: rich would wrap a title longer than its table
    return f"{title}\n{text}" if title else text


def record_row(record: dict[str, Any], *, env: bool = False, metric_names: Iterable[str] = ()) -> dict[str, Any]:
    """Flatten a record to one row: kind, status, config fields, metrics (nested names dotted when they clash; a
    config field named like a metric as `config.<name>`, also where this record lacks the metric but others of
    its table have it: `metric_names`, e.g. from `metric_names_of`); with `env`, also the environment as
    `env.<field>` columns (`env.hostname`, `env.torch`, `env.threads`)."""
    row: dict[str, Any] = {"kind": record.get("kind"), "status": record.get("status")}
    flat: list[tuple[str, str, str, Any]] = []
    for section in ("config", "metrics"):
        data = record.get(section)
        entries: list[tuple[str, str, Any]] = []
        _flatten(data if isinstance(data, dict) else {}, "", entries)
        flat.extend((section, leaf, dotted, value) for leaf, dotted, value in entries)
    counts: dict[str, int] = {}
    for _, leaf, _, _ in flat:
        counts[leaf] = counts.get(leaf, 0) + 1
    names = [leaf if counts[leaf] == 1 and leaf not in ("kind", "status") else dotted for _, leaf, dotted, _ in flat]
    metric_names = {name for (section, *_), name in zip(flat, names, strict=True) if section == "metrics"} | set(
        metric_names)
    for (section, _, dotted, value), name in zip(flat, names, strict=True):
        # a config field named like a metric (`threads`: asked for, None by default, vs used): the metric keeps
        # the name, the config value is `config.<name>`
        row[f"config.{dotted}" if section == "config" and name in metric_names else name] = value
    if record.get("note"):
        row["note"] = record["note"]
    if env:
        # always prefixed: env fields (threads, device) share names with config and metrics fields
        env_fields: list[tuple[str, str, Any]] = []
        _flatten(record.get("env") or {}, "env.", env_fields)
        row.update((dotted, value) for _, dotted, value in env_fields)
    return row


def _flatten(data: dict[str, Any], prefix: str, out: list[tuple[str, str, Any]]) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, dotted + ".", out)
        else:
            out.append((key, dotted, value))


def varying_columns(rows: Sequence[dict[str, Any]], candidates: Iterable[str]) -> list[str]:
    """The candidate columns whose value differs between rows (what a reader needs to tell rows apart)."""
    out = []
    for column in candidates:
        first = rows[0].get(column) if rows else None
        # equality, not a set of serialized values: it stops at the first difference (fast on 10,000 rows);
        # NaN equals NaN here, as its serialized form did
        if any(row.get(column) != first and not (first != first and row.get(column) != row.get(column))
               for row in rows):
            out.append(column)
    return out


QUIET_SUFFIXES = ("_mean", "_std", "_min", "_max", "_p10", "_p90", "_n")
"""Statistics a default view hides where their median is shown: `stepscope show --columns all` shows
everything."""


def default_columns(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The columns `stepscope show` and the report print by default for `records` (their `record_row`s given as
    `rows`): the kind when several are mixed, the configuration fields that tell rows apart, the status and the
    metrics (medians, not every statistic), and the note when a row has one."""
    config_keys = [c for c in columns_of(layout_rows(records, "config")) if c not in ("kind", "status")]
    metrics = columns_of(layout_rows(records, "metrics"))
    medians = {name.removesuffix("_median") for name in metrics if name.endswith("_median")}

    def quiet(name: str) -> bool:
        """A sample count, or a statistic beside its median (comm's time_us_max has none: it stays)."""
        return name.endswith("_n") or any(name.endswith(s) and name[: -len(s)] in medians for s in QUIET_SUFFIXES)

    config_keys = [f"config.{c}" if c in metrics else c for c in config_keys]
    metric_keys = [c for c in metrics if c not in ("kind", "status") and not quiet(c)]
    kinds = ["kind"] if len({r.get("kind") for r in records}) > 1 else []
    identity = varying_columns(rows, config_keys) or [c for c in config_keys if "." not in c][:6]
    columns = kinds + identity + ["status"] + metric_keys
    if any("note" in row for row in rows):
        columns.append("note")
    return columns


def metric_names_of(records: Sequence[dict[str, Any]]) -> set[str]:
    """The metric columns of a set of records (what `record_row` moves a same-named config field away from)."""
    return set(columns_of(layout_rows(records, "metrics")))


def layout_rows(records: Sequence[dict[str, Any]], section: str) -> list[dict[str, Any]]:
    """`record_row` of one section (config or metrics) of each record whose layout (keys, and keys of nested
    tables) was not seen yet: records of one sweep share a layout, so 10,000 records flatten a few times."""
    seen: set[tuple] = set()
    out = []
    for record in records:
        data = record.get(section) or {}
        layout = tuple((k, tuple(v) if isinstance(v, dict) else None) for k, v in data.items())
        if layout not in seen:
            seen.add(layout)
            out.append(record_row({section: data}))
    return out
