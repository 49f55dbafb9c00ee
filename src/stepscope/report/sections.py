"""The sections of the page: the overview (records per kind, where they were measured, warnings for a mixed
study) and one section per record kind (its description, a plot and a table per sort of record, and the
environments it was measured in)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from stepscope.report.environments import Environment, mixed_warnings
from stepscope.report.html import Page
from stepscope.report.kinds import DESCRIPTIONS
from stepscope.report.plots import choose_metric, plot_table
from stepscope.report.study import Study, sub_tables
from stepscope.results.views import (
    columns_of,
    default_columns,
    format_value,
    layout_rows,
    metric_names_of,
    record_row,
)


def anchor(kind: str) -> str:
    return f"kind-{kind}"


def warnings_html(warnings: Sequence[str]) -> str:
    return "".join(f'<p class="warn" role="note">{escape(w)}</p>' for w in warnings)


def overview(page: Page, study: Study, found: dict[str, list[Environment]]) -> None:
    """Records per kind with their statuses and time span, and the warnings of the whole study (`found`: the
    environments of each kind)."""
    rows = []
    for kind, records in study.kinds.items():
        statuses: dict[str, int] = {}
        for record in records:
            statuses[str(record.get("status"))] = statuses.get(str(record.get("status")), 0) + 1
        times = [t for t in ((r.get("env") or {}).get("utc_time") for r in records) if isinstance(t, str)]
        rows.append({"kind": kind, "records": len(records), "ok": statuses.pop("ok", 0),
                     "other statuses": ", ".join(f"{s} {n}" for s, n in statuses.items()) or None,
                     "environments": len(found[kind]),
                     "first (UTC)": min(times) if times else None, "last (UTC)": max(times) if times else None})
    body = [f"<p>{sum(r['records'] for r in rows)} records of {len(rows)} kinds.</p>",
            warnings_html(mixed_warnings([env for envs in found.values() for env in envs])),
            page.table(rows, list(columns_of(rows)), css_class="overview", filter_box=False)]
    page.section("overview", "Overview", body)


def environment_html(page: Page, found: Sequence[Environment]) -> str:
    """The distinct environments of a section's records, and a warning per field that is mixed."""
    rows = []
    for env in found:
        commands = list(env.commands)
        shown = "; ".join(commands[:5]) + (f" (+{len(commands) - 5} more)" if len(commands) > 5 else "")
        rows.append({"records": env.records, **env.fields, "first (UTC)": env.first_utc, "last (UTC)": env.last_utc,
                     "commands": shown or None})
    return ("<h3>Environment</h3>" + warnings_html(mixed_warnings(found)) +
            page.table(rows, list(columns_of(rows)), css_class="environment", filter_box=False))


def kind_section(page: Page, kind: str, records: Sequence[dict[str, Any]], found: Sequence[Environment]) -> None:
    """A kind's section: a plot and a table per sort of record (every record is one table row)."""
    body = [f'<p class="what">{escape(DESCRIPTIONS.get(kind, "Records of kind " + kind + "."))}</p>']
    groups = sub_tables(records)
    for name, members in groups.items():
        named = metric_names_of(members)
        rows = [record_row(r, metric_names=named) for r in members]
        columns = [c for c in default_columns(members, rows) if c != "record"]
        metric_columns = columns_of(layout_rows(members, "metrics"))
        metric = choose_metric(kind, name, rows, metric_columns)
        if metric is not None and metric not in columns:  # the plotted metric is always in the table
            columns.insert(columns.index("status") + 1 if "status" in columns else len(columns), metric)
        identity = columns[: columns.index("status")] if "status" in columns else []
        if name is not None or len(groups) > 1:
            body.append(f"<h3>{escape(str(name))} records <span class=count>{len(members)}</span></h3>")
        plot = plot_table(kind, name, rows, identity, metric)
        if plot:
            caption = f"{metric} per row" if "<rect" in plot else f"{metric}"
            body.append(f"<figure>{plot}<figcaption class=caption>{escape(caption)}; hover a point or bar for its "
                        "value</figcaption></figure>")
        body.append(page.table(rows, columns, data={"kind": kind, "table": name or "", "records": len(members)}))
    body.append(environment_html(page, found))
    page.section(anchor(kind), kind, body, note=f"{len(records)} records", css_class="kind",
                 data={"kind": kind, "records": len(records)})


def header_html(study: Study, generated: str, version: str) -> str:
    paths = ", ".join(f"<code>{escape(p)}</code>" for p in study.paths)
    return (f'<p class="meta">{format_value(len(study.records))} records from {paths}; written {escape(generated)} by '
            f"stepscope {escape(version)}. Tables sort on a click on their header and filter on the words typed "
            "above them.</p>")
