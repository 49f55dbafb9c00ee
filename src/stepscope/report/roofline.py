"""The roofline section: how well each op of a traced run used the GPU, from the `trace` records `stepscope trace`
writes for traces recorded with shapes (`roofline`: one (op, shape, precision) of one rank; `roofline_total`: one op
family, `gemm` being the matmul family's total line). Present when the study holds such records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepscope.report.html import Page
from stepscope.report.study import Study

ANCHOR = "roofline"
TOTAL_COLUMNS = ["rank", "family", "precision", "calls", "kernels", "time_ms", "GFLOP", "TFLOPps", "peak_pct", "GBps",
                 "bandwidth_pct"]
OP_COLUMNS = ["rank", "op", "shape", "precision", "calls", "kernels", "time_ms", "GFLOP_per_call", "TFLOPps",
              "peak_pct", "GBps", "bandwidth_pct", "intensity_FLOP_per_byte", "bound"]


def roofline_rows(records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(family totals, ops) of the `trace` records, each by GPU time, longest first; a `file` column where the
    records come from more than one trace file."""
    files = {(r.get("config") or {}).get("file") for r in records}
    totals, ops = [], []
    for record in records:
        config, metrics = record.get("config") or {}, record.get("metrics") or {}
        kind = config.get("record")
        if kind not in ("roofline", "roofline_total") or record.get("status", "ok") != "ok":
            continue
        row = {**({"file": config.get("file")} if len(files) > 1 else {}),
               **{k: v for k, v in {**config, **metrics}.items()
                  if k in (TOTAL_COLUMNS if kind == "roofline_total" else OP_COLUMNS)}}
        (totals if kind == "roofline_total" else ops).append(row)
    longest = lambda row: -(row.get("time_ms") or 0.0)  # noqa: E731
    return sorted(totals, key=longest), sorted(ops, key=longest)


def roofline_section(page: Page, study: Study) -> None:
    """Add the section when the study holds roofline records."""
    totals, ops = roofline_rows(study.kinds.get("trace", []))
    if not totals and not ops:
        return
    ordered = [c for c in ["file", *TOTAL_COLUMNS] if any(c in row for row in totals)]
    columns = [c for c in ["file", *OP_COLUMNS] if any(c in row for row in ops)]
    body = ["<p>Each op whose shapes the trace recorded: its FLOPs and bytes from the shapes, the GPU time of the "
            "kernels it launched, the achieved TFLOP/s and GB/s and their share of the device's peaks "
            "(<code>peak_pct</code>: of the matrix peak of its precision; <code>bandwidth_pct</code>: of the memory "
            "bandwidth); <code>bound</code> says which roof its FLOP per byte puts it under. docs/traces.md: "
            "Roofline.</p>",
            "<h3>per op family <span class=count>" + str(len(totals)) + "</span></h3>",
            page.table(totals, ordered, css_class="roofline", data={"table": "roofline_total"}),
            "<h3>per op, shape and precision <span class=count>" + str(len(ops)) + "</span></h3>",
            page.table(ops, columns, css_class="roofline", data={"table": "roofline"})]
    page.section(ANCHOR, "Roofline", body, note=f"{len(ops)} ops")
