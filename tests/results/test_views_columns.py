"""The default columns of a view (`stepscope show`, the report): configuration fields that differ, the status,
metrics without spread statistics; each record layout flattened once."""

from __future__ import annotations

from stepscope.results.store import make_record
from stepscope.results.views import default_columns, layout_rows, record_row, varying_columns


def test_varying_columns_compare_values_with_nan_equal_to_itself():
    nan = float("nan")
    rows = [{"a": nan, "b": 1, "c": {"x": 1}}, {"a": nan, "b": 2, "c": {"x": 1}}]
    assert varying_columns(rows, ["a", "b", "c"]) == ["b"]
    assert varying_columns([{"a": nan}, {"a": 1.0}], ["a"]) == ["a"]


def test_default_columns_name_what_differs_the_status_and_the_medians():
    records = [make_record("step", {"model": "tiny", "seq": seq}, {"step_ms_median": 1.0, "step_ms_max": 2.0})
               for seq in (16, 32)]
    records.append(make_record("step", {"model": "tiny", "seq": 64}, status="oom", note="out of memory"))
    rows = [record_row(r) for r in records]
    assert default_columns(records, rows) == ["seq", "status", "step_ms_median", "note"]
    assert len(layout_rows(records, "config")) == 1 and len(layout_rows(records, "metrics")) == 2
