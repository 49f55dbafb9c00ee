"""`stepscope report`: one self-contained HTML page for a whole study — a section per record kind (table, plot,
environment), measurements beside predictions of the same configuration, warnings for mixed environments.

Self-contained: the style, the script and the plots (hand-written inline SVG, `svg`) are in the file; it names
no URL, so it opens offline, attached to a mail or a paper. `build(paths)` returns the page, `write_report`
writes it. May import: errors, host, results, distributed.collectives.alpha_beta (numpy only, for the fits)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path

from stepscope.report.compared import compared_section
from stepscope.report.environments import environments
from stepscope.report.html import Page
from stepscope.report.roofline import roofline_section
from stepscope.report.sections import header_html, kind_section, overview
from stepscope.report.study import load_study
from stepscope.results.files import check_writable_file

__all__ = ["build", "write_report"]


def build(paths: Sequence[str | os.PathLike], *, title: str | None = None) -> str:
    """The HTML page of every record in `paths` (results folders or .jsonl files); UsageError when none."""
    from stepscope import __version__

    study = load_study(paths)
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    page = Page(title or f"stepscope report: {', '.join(study.paths)}",
                header=header_html(study, generated, __version__))
    found = {kind: environments(records) for kind, records in study.kinds.items()}
    overview(page, study, found)
    compared_section(page, study)
    roofline_section(page, study)
    for kind, records in study.kinds.items():
        kind_section(page, kind, records, found[kind])
    return page.render()


def write_report(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, title: str | None = None) -> Path:
    """Write `build(paths)` to `out` (proven writable before the records are read) and return its path."""
    target = check_writable_file(out, "the report")
    html = build(paths, title=title)
    target.write_text(html, encoding="utf-8")
    return target
