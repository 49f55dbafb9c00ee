"""The browser check: a clean skip without a browser; with one (Debian's chromium), a real page passes and a page
with a script error or an empty plot fails."""

from __future__ import annotations

import pytest

from stepscope.report import browser_check
from stepscope.report.browser_check import find_browser, main


def test_without_a_browser_the_check_skips_loudly_and_fails_where_required(monkeypatch, capsys):
    monkeypatch.setenv("STEPSCOPE_BROWSER", "no-such-browser-here")
    monkeypatch.delenv("STEPSCOPE_REQUIRE_BROWSER", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert main([]) == 0
    assert "browser-check skipped: no Chromium found" in capsys.readouterr().out
    for name, value in (("STEPSCOPE_REQUIRE_BROWSER", "1"), ("CI", "true")):
        monkeypatch.setenv(name, value)
        assert main([]) == 1
        out = capsys.readouterr().out
        assert "browser-check FAILED: no Chromium found" in out and "NOT verified" in out
        monkeypatch.delenv(name)


def test_playwrights_downloaded_chromium_is_found(monkeypatch, tmp_path):
    monkeypatch.delenv("STEPSCOPE_BROWSER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # nothing on PATH
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path))
    assert find_browser() is None
    for build in ("chromium-1100", "chromium-1200"):
        chrome = tmp_path / build / "chrome-linux" / "chrome"
        chrome.parent.mkdir(parents=True)
        chrome.write_text("#!/bin/sh\n")
        chrome.chmod(0o755)
    assert find_browser() == str(tmp_path / "chromium-1200" / "chrome-linux" / "chrome")


def test_problems_name_every_failure():
    fine = {"errors": [], "svgs": 2, "empty_svgs": [], "sorted": True, "filtered": True, "background": "white"}
    assert browser_check.problems(fine, {**fine, "background": "black"}) == []
    broken = {**fine, "errors": ["uncaught: x"], "empty_svgs": ["kind-step"], "sorted": False}
    found = browser_check.problems(broken, fine)
    assert found == ["uncaught: x", "an SVG with an empty bounding box in section kind-step",
                     "sorting a numeric column did not order its rows",
                     "the page ignores a dark colour scheme (background white in both)"]


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None, reason="no Chromium on this machine")
def test_a_real_browser_passes_a_report_and_fails_a_broken_one(tmp_path, capsys):
    assert main(["--screenshot", str(tmp_path / "shot.png")]) == 0
    assert (tmp_path / "shot.png").stat().st_size > 0 and "browser-check passed" in capsys.readouterr().out
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head></head><body><section id=s><svg width=0 height=0></svg></section>"
                    "<script>notDefined()</script></body></html>")
    light = browser_check.probe(find_browser(), page)
    assert light["empty_svgs"] == ["s"] and any("notDefined" in e for e in light["errors"])
