"""`stepscope show PATH`: render stored records as a table, CSV, Markdown or JSON."""

from __future__ import annotations

import argparse

from stepscope.results.views import FORMATS

NAME = "show"
HELP = "render stored records"
DESCRIPTION = ("Render records from a .jsonl file or a results folder. Default columns: the configuration fields "
               "that differ between records, the status, and the metrics (medians, not every statistic).")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a .jsonl file or a folder of them (e.g. stepscope-results)")
    parser.add_argument("--format", default="table", choices=FORMATS)
    parser.add_argument("--columns", default=None,
                        help="comma list of columns to show, or `all` (config and metrics); environment fields "
                             "as env.<field>, e.g. env.hostname, env.torch, env.git_sha, env.utc_time, env.threads")
    parser.add_argument("--group-by", default=None,
                        help="comma list of columns: one table per value (table, md); csv and json print them "
                             "as the first columns of every row instead")
    parser.add_argument("--kind", default=None, help="only records of this kind (step, profile, comm, ...)")
    parser.add_argument("--status", default=None, help="only records with this status (ok, oom, ...)")


def run(args: argparse.Namespace) -> int:
    from stepscope.cli.options import parse_list
    from stepscope.cli.output import Printer
    from stepscope.errors import UsageError
    from stepscope.results.store import read_records
    from stepscope.results.views import columns_of, default_columns, metric_names_of, record_row

    records = read_records(args.path)
    if args.kind:
        records = [r for r in records if r.get("kind") == args.kind]
    if args.status:
        records = [r for r in records if r.get("status") == args.status]
    if not records:
        raise UsageError(f"no records in {args.path}" + (" matching the filters" if args.kind or args.status else ""))
    named = metric_names_of(records)
    rows = [record_row(r, env=True, metric_names=named) for r in records]
    available = columns_of(rows)
    if args.columns == "all":
        columns = [c for c in available if not c.startswith("env.")]
    elif args.columns:
        columns = parse_list(args.columns, str, "--columns")
        unknown = [c for c in columns if c not in available]
        if unknown:
            raise UsageError(_unknown("column", unknown[0], available))
    else:
        columns = default_columns(records, rows)
    printer = Printer(args.format)
    if not args.group_by:
        printer.emit(rows, columns=columns)
        return 0
    group_by = parse_list(args.group_by, str, "--group-by")
    unknown = [c for c in group_by if c not in available]
    if unknown:
        raise UsageError(_unknown("--group-by column", unknown[0], available))
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(str(row.get(c)) for c in group_by), []).append(row)
    shown = [c for c in columns if c not in group_by]
    if args.format in ("csv", "json"):
        # machine-readable output has no titles: each row carries its group's values, groups kept together
        printer.emit([row for group in groups.values() for row in group], columns=[*group_by, *shown])
        return 0
    for values, group in groups.items():
        title = ", ".join(f"{c}={v}" for c, v in zip(group_by, values, strict=True))
        printer.emit(group, columns=shown, title=title)
    return 0


def _unknown(what: str, name: str, available: list[str]) -> str:
    """The one-line error for a column no record has, with every column that exists."""
    hint = f" (environment fields are prefixed: env.{name})" if f"env.{name}" in available else ""
    return f"unknown {what} {name!r}{hint}; available: {', '.join(available)}"
