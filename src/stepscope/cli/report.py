"""`stepscope report RESULTS_DIR... --out report.html`: one self-contained HTML page for a whole study.
The work: `stepscope.report.write_report`."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_alias

NAME = "report"
HELP = "one self-contained HTML page of a study: every record kind, plots, environments, measured vs predicted"
DESCRIPTION = ("Write one HTML file (styles, scripts and SVG plots inline; it names no URL, so it opens offline) with "
               "a section per record kind in the given results folders or .jsonl files: a sortable, filterable "
               "table of every record, a plot, the environments they were measured in and warnings where those "
               "differ; measured steps, traces and collectives beside the predictions or α–β fits of the same "
               "configuration.")

DEFAULT_OUTPUT = "report.html"
"""Where the page goes without --out."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="RESULTS", help="results folders or .jsonl files")
    parser.add_argument("-o", "--out", default=DEFAULT_OUTPUT, help=f"the HTML file (default {DEFAULT_OUTPUT})")
    add_alias(parser, "--output", "--out")
    parser.add_argument("--title", default=None, help="the page's title (default: the paths it covers)")
    parser.add_argument("--open", action="store_true", help="open the page in the default browser")


def run(args: argparse.Namespace) -> int:
    from stepscope.report import write_report

    path = write_report(args.paths, args.out, title=args.title)
    print(f"report: {path} ({path.stat().st_size / 2**20:.2f} MiB)")
    if args.open:
        import webbrowser

        if not webbrowser.open(path.resolve().as_uri()):
            print("no browser could be started: open the file yourself")
    return 0
