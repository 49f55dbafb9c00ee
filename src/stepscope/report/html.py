"""HTML pieces of the page: a sortable, filterable table of rows and the page around the sections.

Numbers are shown as every view shows them (`results.views.format_value`); a numeric column is right-aligned by
one CSS rule for the whole table (`nth-child`), not an attribute per cell, so a study of 10,000 records stays a
few MB."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from stepscope.report.assets import SCRIPT, STYLE
from stepscope.results.views import format_value

WRAPPED = ("note", "command", "commands", "method")
"""Columns of long text: wrapped instead of kept on one line."""


def _numeric(rows: Sequence[dict[str, Any]], column: str) -> bool:
    values = [row.get(column) for row in rows if row.get(column) is not None]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _cell(value: Any) -> str:
    if value.__class__ is str:  # most cells: skip format_value's number checks
        return escape(value, quote=False)
    if isinstance(value, (list, tuple)):
        return escape("; ".join(format_value(v) for v in value))  # ", " would read as a thousands separator
    if isinstance(value, dict):
        return escape(", ".join(f"{k}={format_value(v)}" for k, v in value.items()))
    return escape(format_value(value), quote=False)


@dataclass
class Page:
    """The page being written: its sections, table of contents and per-table style rules."""

    title: str
    header: str = ""
    toc: list[tuple[str, str, str]] = field(default_factory=list)
    """(anchor, title, note) per section."""
    sections: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    tables: int = 0

    def section(self, anchor: str, title: str, body: Sequence[str], *, note: str = "", css_class: str = "",
                data: dict[str, Any] | None = None) -> None:
        attributes = "".join(f' data-{k}="{escape(str(v))}"' for k, v in (data or {}).items())
        count = f' <span class="count">{escape(note)}</span>' if note else ""
        self.toc.append((anchor, title, note))
        self.sections.append(f'<section id="{escape(anchor)}" class="{css_class}"{attributes}>'
                             f"<h2>{escape(title)}{count}</h2>" + "".join(body) + "</section>")

    def table(self, rows: Sequence[dict[str, Any]], columns: Sequence[str], *, css_class: str = "records",
              filter_box: bool = True, data: dict[str, Any] | None = None) -> str:
        """A table of `rows` (one `<tr>` each) under a header of `columns`, sortable; with `filter_box`, a field
        above it that hides the rows not containing every typed word."""
        self.tables += 1
        table_id = f"t{self.tables}"
        numeric = [i + 1 for i, c in enumerate(columns) if _numeric(rows, c)]
        wrapped = [i + 1 for i, c in enumerate(columns) if c in WRAPPED]
        if numeric:
            self.rules.append(",".join(f"#{table_id} td:nth-child({i})" for i in numeric) + "{text-align:right}")
        if wrapped:
            self.rules.append(",".join(f"#{table_id} td:nth-child({i})" for i in wrapped) + "{white-space:normal}")
        head = "".join(f'<th{" data-type=n" if i + 1 in numeric else ""}>{escape(c)}</th>'
                       for i, c in enumerate(columns))
        body = "".join("<tr>" + "".join(f"<td>{_cell(row.get(c))}</td>" for c in columns) + "</tr>" for row in rows)
        attributes = "".join(f' data-{k}="{escape(str(v))}"' for k, v in (data or {}).items())
        table = (f'<div class="table-wrap"><table id="{table_id}" class="{css_class} sortable"{attributes}>'
                 f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
        if not filter_box:
            return table
        tools = (f'<div class="table-tools"><input type="search" class="filter" data-table="{table_id}" '
                 f'placeholder="filter rows (words)" aria-label="filter rows"><span class="shown">{len(rows)} rows'
                 "</span></div>")
        return tools + table

    def render(self) -> str:
        toc = "".join(f'<li><a href="#{escape(a)}">{escape(t)}</a>'
                      + (f" <span class=count>{escape(n)}</span>" if n else "") + "</li>" for a, t, n in self.toc)
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{escape(self.title)}</title><style>{STYLE}{''.join(self.rules)}</style></head><body>"
                f"<header><h1>{escape(self.title)}</h1>{self.header}</header>"
                f'<nav id="toc" aria-label="contents"><h2>Contents</h2><ol>{toc}</ol></nav>'
                f"<main>{''.join(self.sections)}</main><script>{SCRIPT}</script></body></html>\n")
