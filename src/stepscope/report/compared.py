"""The section that puts measurements next to predictions of the same configuration (see `matches`): a table
and a plot per pairing, present when the study holds both sides."""

from __future__ import annotations

from html import escape

from stepscope.report.html import Page
from stepscope.report.matches import comm_vs_fit, fit_curve, step_vs_predict, trace_vs_predict
from stepscope.report.plots import MAX_SERIES
from stepscope.report.study import Study
from stepscope.report.svg import Series, line_chart
from stepscope.results.views import columns_of, format_value

ANCHOR = "measured-vs-predicted"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption class=caption>{escape(caption)}</figcaption></figure>"


def compared_section(page: Page, study: Study) -> None:
    """Add the section when any pairing exists."""
    body: list[str] = []
    steps = step_vs_predict(study.kinds.get("step", []), study.kinds.get("predict", []))
    if steps:
        timed = [row for row in steps if "step_measured_ms" in row]  # a record may lack the whole-step time
        figure = []
        if timed:
            points = [(row["step_measured_ms"], row["step_predicted_ms"]) for row in timed]
            low, high = min(min(p) for p in points), max(max(p) for p in points)
            if len(timed) <= MAX_SERIES:  # a colour and a legend entry per pair while they stay readable
                scatter = [Series(f"{r['model']} b{r['batch']} s{r['seq']} {r['mode']} {r['precision']}",
                                  [(r["step_measured_ms"], r["step_predicted_ms"])], joined=False) for r in timed]
            else:
                scatter = [Series("measured steps", points, joined=False)]
            svg = line_chart([*scatter, Series("predicted = measured", [(low, low), (high, high)], dashed=True,
                                               colour=7)],
                             x_label="measured step ms", y_label="predicted step ms", log_x=True, log_y=True)
            figure = [_figure(svg, "predicted against measured step time; on the dashed line the model is exact")]
        body += ["<h3>step vs predict</h3>",
                 "<p>Each measured step beside the one-GPU prediction of the same model, batch, sequence, precision, "
                 "mode and plan; error = (predicted − measured) / measured.</p>", *figure,
                 page.table(steps, columns_of(steps), css_class="match", data={"match": "step-predict"})]
    rows, fits = comm_vs_fit(study.kinds.get("comm", []))
    if rows:
        series, measured = [], {}
        for row in rows:
            measured.setdefault(row["group"], []).append((row["size_bytes"], row["time_measured_us"]))
        for colour, (label, fit) in enumerate(list(fits.items())[: MAX_SERIES // 2]):
            sizes = [size for size, _ in measured[label]]
            series.append(Series(label, measured[label], colour=colour))
            series.append(Series(f"{label} α–β fit (α {format_value(fit.alpha_us)} us, β "
                                 f"{format_value(fit.beta_GBps)} GB/s)", fit_curve(fit, min(sizes), max(sizes)),
                                 dashed=True, colour=colour))
        svg = line_chart(series, x_label="size_bytes", y_label="time_us", log_x=True, log_y=True)
        body += ["<h3>comm vs α–β fit</h3>",
                 "<p>Each measured collective beside the fitted t(S) = α + factor·S/β made from its own sweep.</p>",
                 _figure(svg, "measured points and their fitted curves (dashed)" + (
                     f"; the first {MAX_SERIES // 2} of {len(fits)} groups (every point is in the table)"
                     if len(fits) > MAX_SERIES // 2 else "")),
                 page.table(rows, columns_of(rows), css_class="match", data={"match": "comm-fit"})]
    traces = trace_vs_predict(study.kinds.get("compare", []))
    if traces:
        body += ["<h3>trace vs predict</h3>",
                 "<p>Traces beside the prediction of the run's model, plan and system (<code>stepscope compare "
                 "--trace</code> records: a trace stores no model, so that command names it).</p>",
                 page.table(traces, columns_of(traces), css_class="match", data={"match": "trace-predict"})]
    if body:
        page.section(ANCHOR, "Measured vs predicted", body, note=f"{len(steps) + len(rows) + len(traces)} pairs")
