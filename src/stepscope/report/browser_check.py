"""`python -m stepscope.report.browser_check [REPORT.html]` (`make browser-check`): load a report in headless
Chromium and check what only a browser can: no console errors or uncaught exceptions, every plot laid out (each
SVG has a non-empty bounding box), sorting and filtering work, the page follows a dark colour scheme, it prints to
PDF; then save a screenshot. Without a report it checks one of a generated study (`benchmark.synthetic_study`).

How: a copy of the page gets a probe script at the top of its <head> that records errors, and after `load` measures
the SVGs, clicks a numeric header, types into a filter and writes what it found into the DOM, which Chromium's
`--dump-dom` prints (`--virtual-time-budget` lets the page's timers run first). No browser automation library, no
network: Debian's `chromium` is enough (or Playwright's downloaded Chromium). No browser found: a loud notice and exit
0 (a skip), or exit 1 where the check is required (STEPSCOPE_REQUIRE_BROWSER=1, which `.ci/run` sets, or CI set)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
"""Executables tried in order; STEPSCOPE_BROWSER names another (or a missing one, to force the skip)."""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
TIMEOUT_S = 120

PROBE = r"""<script>(function(){
var p={errors:[]};window.__probe=p;
var original=console.error;
console.error=function(){p.errors.push('console.error: '+Array.prototype.join.call(arguments,' '));
  return original.apply(console,arguments)};
window.addEventListener('error',function(e){var t=e.target||{};
  p.errors.push(e.message?'uncaught: '+e.message:'failed to load: '+(t.src||t.href||t.tagName))},true);
window.addEventListener('unhandledrejection',function(e){p.errors.push('unhandled rejection: '+e.reason)});
function values(table,col){return Array.prototype.map.call(table.tBodies[0].rows,function(r){
  return parseFloat(r.cells[col].textContent.replace(/,/g,''))}).filter(function(v){return !isNaN(v)})}
window.addEventListener('load',function(){
  var svgs=Array.prototype.slice.call(document.querySelectorAll('svg'));p.svgs=svgs.length;
  p.empty_svgs=svgs.filter(function(s){var r=s.getBoundingClientRect(),b=s.getBBox();
    return !(r.width>0&&r.height>0&&b.width>0&&b.height>0)}).map(function(s){
    var section=s.closest('section');return section?section.id:'(no section)'});
  p.background=getComputedStyle(document.body).backgroundColor;
  var th=document.querySelector('table.sortable th[data-type=n]');
  if(th){var table=th.closest('table'),col=th.cellIndex;th.click();var v=values(table,col);
    p.sorted=v.every(function(x,i){return i===0||v[i-1]<=x});th.click();v=values(table,col);
    p.sorted=p.sorted&&v.every(function(x,i){return i===0||v[i-1]>=x})}
  var inputs=Array.prototype.slice.call(document.querySelectorAll('input.filter'));
  var input=inputs.sort(function(a,b){return document.getElementById(b.dataset.table).tBodies[0].rows.length-
    document.getElementById(a.dataset.table).tBodies[0].rows.length})[0];
  if(input){var rows=document.getElementById(input.dataset.table).tBodies[0].rows,first=rows[0],
    last=rows[rows.length-1],word=null;
    for(var c=0;c<last.cells.length&&word===null;c++){var t=last.cells[c].textContent.trim().toLowerCase();
      if(t&&!/\s/.test(t)&&t!==first.cells[c].textContent.trim().toLowerCase()){word=t}}
    word=word||last.cells[0].textContent.trim().toLowerCase();
    var expected=Array.prototype.filter.call(rows,function(r){
      return r.textContent.toLowerCase().indexOf(word)>=0}).length;
    input.value=word;input.dispatchEvent(new Event('input'));
    setTimeout(function(){var shown=Array.prototype.filter.call(rows,function(r){return !r.hidden});
      p.filter_word=word;p.filter_rows=[shown.length,rows.length];
      p.filtered=shown.length===expected&&shown.every(function(r){
        return r.textContent.toLowerCase().indexOf(word)>=0})},500)}
  setTimeout(function(){var pre=document.createElement('pre');pre.id='probe-result';
    pre.textContent=JSON.stringify(p);document.body.appendChild(pre)},1000);
});})();</script>"""


def find_browser() -> str | None:
    """STEPSCOPE_BROWSER when set (None if it is no executable), else the first of BROWSERS on PATH, else the
    newest Chromium in Playwright's browser cache (PLAYWRIGHT_BROWSERS_PATH or ~/.cache/ms-playwright)."""
    named = os.environ.get("STEPSCOPE_BROWSER")
    if named is not None:
        return shutil.which(named)
    on_path = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if on_path is not None:
        return on_path
    cache = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache" / "ms-playwright")
    downloaded = sorted(cache.glob("chromium-*/chrome-linux*/chrome"), key=lambda p: p.parent.parent.name)
    return str(downloaded[-1]) if downloaded and os.access(downloaded[-1], os.X_OK) else None


def required() -> bool:
    """Whether a missing browser fails the check: STEPSCOPE_REQUIRE_BROWSER=1 (`.ci/run`), or CI set (1/true)."""
    return (os.environ.get("STEPSCOPE_REQUIRE_BROWSER") == "1"
            or os.environ.get("CI", "").lower() in ("1", "true", "yes"))


def _run(browser: str, args: list[str], profile: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def probe(browser: str, report: Path, *, dark: bool = False) -> dict[str, Any]:
    """Load a probed copy of `report` and return what the probe found (errors, SVGs, sort, filter, background)."""
    html = report.read_text(encoding="utf-8")
    head = html.index("<head>") + len("<head>")
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "probed.html"
        page.write_text(html[:head] + PROBE + html[head:], encoding="utf-8")
        extra = ["--force-dark-mode", "--blink-settings=preferredColorScheme=0"] if dark else []
        done = _run(browser, [*extra, "--window-size=1280,1800", "--virtual-time-budget=10000", "--dump-dom",
                              page.as_uri()], str(Path(scratch) / "profile"))
    marker = '<pre id="probe-result">'
    if marker not in done.stdout:
        raise RuntimeError(f"the probe did not report (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    text = done.stdout.split(marker, 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(browser: str, report: Path, out: Path, *, width: int = 1280, height: int = 1800) -> Path:
    """A PNG of the top of the page as a reader first sees it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        _run(browser, [f"--window-size={width},{height}", "--virtual-time-budget=5000", f"--screenshot={out}",
                       report.resolve().as_uri()], str(Path(scratch) / "profile"))
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"no screenshot was written to {out}")
    return out


def print_pages(browser: str, report: Path) -> int:
    """Print the page to PDF as a reader's "Save as PDF" would (the print stylesheet applies) and count its pages
    (0: no PDF came out)."""
    with tempfile.TemporaryDirectory() as scratch:
        pdf = Path(scratch) / "report.pdf"
        _run(browser, ["--no-pdf-header-footer", f"--print-to-pdf={pdf}", report.resolve().as_uri()],
             str(Path(scratch) / "profile"))
        data = pdf.read_bytes() if pdf.exists() else b""
    if not data.startswith(b"%PDF"):
        return 0
    # page objects are plain text in Chromium's PDFs; were they ever compressed, a PDF still counts as one page
    return max(data.count(b"/Type /Page") - data.count(b"/Type /Pages"), 1)


def problems(light: dict[str, Any], dark: dict[str, Any]) -> list[str]:
    """What the probes found wrong, one line each (empty: the page passed)."""
    found = [*light["errors"], *(f"(dark) {e}" for e in dark["errors"])]
    if not light.get("svgs"):
        found.append("no SVG plot on the page")
    found += [f"an SVG with an empty bounding box in section {s}" for s in light.get("empty_svgs", [])]
    if light.get("sorted") is False:
        found.append("sorting a numeric column did not order its rows")
    if light.get("filtered") is False:
        found.append(f"filtering on {light.get('filter_word')!r} did not keep exactly the matching rows")
    if light.get("background") == dark.get("background"):
        found.append(f"the page ignores a dark colour scheme (background {light.get('background')} in both)")
    return found


def _generated_report(folder: Path) -> Path:
    from stepscope.report import write_report
    from stepscope.report.benchmark import synthetic_study
    from stepscope.results.store import RecordStore

    for record in synthetic_study(500):
        RecordStore(folder, record["kind"]).append(record)
    return write_report([folder], folder / "report.html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", help="the HTML report to check (default: one of a generated study)")
    parser.add_argument("--screenshot", default="stepscope-results/browser-check.png", help="where the PNG goes")
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        needed = required()
        print("#" * 100)
        print(f"browser-check {'FAILED' if needed else 'skipped'}: no Chromium found, so sorting, filtering, the dark "
              "scheme and printing are NOT verified (Debian: apt-get install chromium; or set STEPSCOPE_BROWSER to a "
              "Chrome/Chromium executable)" + ("; required here (STEPSCOPE_REQUIRE_BROWSER=1 or CI)" if needed else ""))
        print("#" * 100)
        return 1 if needed else 0
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(args.report) if args.report else _generated_report(Path(scratch))
        light, dark = probe(browser, report), probe(browser, report, dark=True)
        shot = screenshot(browser, report, Path(args.screenshot))
        pages = print_pages(browser, report)
    version = subprocess.run([browser, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"{version}: {light['svgs']} SVG plots, sorted {light.get('sorted')}, filter kept "
          f"{(light.get('filter_rows') or ['-'])[0]} of {(light.get('filter_rows') or ['-', '-'])[1]} rows on "
          f"{light.get('filter_word')!r}, background {light['background']} (light) / {dark['background']} (dark)")
    found = problems(light, dark) + ([] if pages else ["printing to PDF gave no page"])
    for line in found:
        print(f"FAIL: {line}")
    print(f"printed to PDF: {pages} pages")
    print(f"screenshot: {shot}")
    print("browser-check " + ("failed" if found else "passed"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
