"""Records (append-only JSON Lines) and what is made of them, no torch: `store` (records, resume), `sweep` (a list
of points into a store, OOM rows), `tables` (a point's tables as records), `views` (table, CSV, Markdown,
JSON), `files` (every output file proven writable first), `environment` (where a record was made).
May import: errors, host."""

from stepscope.results.store import RecordStore, make_record, point_key, read_records
from stepscope.results.views import record_row, render

__all__ = ["RecordStore", "make_record", "point_key", "read_records", "record_row", "render"]
