"""The report's roofline section: the roofline records of a real H100 trace (tests/data/traces) as two tables, per
op family (the GEMM total line) and per op, each row the record's own numbers, longest first; no section without
such records."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from stepscope.report import build
from stepscope.results.store import read_records
from stepscope.traces.run import write_trace_records

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "small-b8.json.gz"


class Tables(HTMLParser):
    """The rows of the tables inside the roofline section, as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.tables, self.cell = False, [], None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "section":
            self.inside = dict(attrs).get("id") == "roofline"
        elif self.inside and tag == "table":
            self.tables.append([])
        elif self.inside and tag == "tr":
            self.tables[-1].append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None


def test_roofline_section_shows_the_records(tmp_path: Path) -> None:
    records = read_records(write_trace_records((str(TRACE),), tmp_path))
    parser = Tables()
    parser.feed(build([tmp_path]))
    totals, ops = parser.tables
    header = totals[0]
    gemm = next(dict(zip(header, row, strict=True)) for row in totals[1:] if row[header.index("family")] == "gemm")
    (record,) = [r for r in records if r["config"]["record"] == "roofline_total" and r["config"]["family"] == "gemm"]
    assert float(gemm["TFLOPps"]) == pytest.approx(record["metrics"]["TFLOPps"], rel=1e-3)
    assert float(gemm["peak_pct"]) == pytest.approx(record["metrics"]["peak_pct"], rel=1e-3)
    shown = [dict(zip(ops[0], row, strict=True)) for row in ops[1:]]
    assert len(shown) == sum(r["config"]["record"] == "roofline" for r in records)
    times = [float(row["time_ms"]) for row in shown]
    assert times == sorted(times, reverse=True) and {"op", "shape", "TFLOPps", "bound"} <= set(ops[0])


def test_no_roofline_records_no_section(tmp_path: Path) -> None:
    from tests.traces.kineto import two_step_rank

    write_trace_records((str(two_step_rank().write(tmp_path / "r.json")),), tmp_path / "out")
    assert 'id="roofline"' not in build([tmp_path / "out"])
