"""Records (append-only JSON Lines), sweeps with resume, and views (table, CSV, Markdown, JSON). No torch."""

from stepscope.results.store import RecordStore, make_record, point_key, read_records
from stepscope.results.views import record_row, render

__all__ = ["RecordStore", "make_record", "point_key", "read_records", "record_row", "render"]
