"""`stepscope report`: a page with a section per record kind the code writes (found by reading src/), a table row
per record, plots, environments, measured-vs-predicted pairs, and no URL; read back with an HTML parser."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import stepscope
from stepscope.distributed.collectives.alpha_beta import fit_records
from stepscope.report import build
from stepscope.report.kinds import DESCRIPTIONS
from stepscope.results.store import RecordStore, make_record
from tests.conftest import subprocess_env

SRC = Path(stepscope.__file__).parent
KIND_PATTERNS = (r'(?:RecordStore|RunRecords|start_run)\([^()]*?"([a-z][a-z-]*)"\)',
                 r'(?:make_record|Table)\(\s*"([a-z][a-z-]*)"', r'Sweep\(kind="([a-z][a-z-]*)"')


def written_kinds() -> set[str]:
    """Every record kind a module of stepscope writes, read from the source."""
    kinds: set[str] = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for pattern in KIND_PATTERNS:
            kinds.update(re.findall(pattern, text))
    return kinds


def env(host: str = "vm", **extra) -> dict:
    return {"hostname": host, "cpu_model": "AMD EPYC", "torch": "2.13.0+cpu", "git_sha": "abc123",
            "stepscope_version": "0.1.0", "utc_time": "2026-11-25T10:00:00+00:00", "command": "stepscope x", **extra}


def generic_records(kind: str, n: int = 3) -> list[dict]:
    # list and table values too (calibrate, precision and straggler records hold them)
    return [make_record(kind, {"ranks": [0, i], "case": f"c{i}", "seq": 16 * (i + 1), "plan": {"dp": i}},
                        {"time_ms": 1.5 * (i + 1), "count": i, "rows": [{"a": i}]}, env=env()) for i in range(n)]


def comm_records() -> list[dict]:
    points = []
    for size in (1024, 65536, 1048576, 4194304):
        config = {"record": "point", "backend": "gloo", "op": "all_reduce", "world_size": 2, "size_bytes": size,
                  "dtype": "fp32", "mode": "per-op", "in_place": True}
        points.append(make_record("comm", config, {"time_us_max": 50 + size / 1e3, "time_us_mean": 45 + size / 1e3,
                                                   "busbw_GBps": size / (50 + size / 1e3) / 1e3}, env=env()))
    points.append(make_record("comm", {**points[0]["config"], "in_place": False}, status="unsupported", env=env(),
                              note="in place only"))
    fits, _ = fit_records(points)
    return points + fits


def trace_records() -> list[dict]:
    out = []
    for rank in (0, 1):
        for step in (1, 2):
            config = {"record": "step", "file": f"rank{rank}.json", "rank": rank, "world_size": 2, "step": step}
            out.append(make_record("trace", config, {"step_ms": 10.0 + rank + step, "idle_pct": 20.0}, env=env()))
        out.append(make_record("trace", {"record": "rank", "rank": rank, "step": "all"}, {"step_ms": 11.0},
                               env=env()))
    return out


def compare_records() -> list[dict]:
    plan = {"dp": 2, "tp": 1, "pp": 1, "cp": 1}
    return [make_record("compare", {"source": "trace", "rank": r, "model": "small", "batch": 16, "seq": 1024,
                                    "plan": plan, "system": "A100-80GB"},
                        {"step_measured_ms": 200.0 + r, "step_predicted_ms": 40.0, "step_error_pct": -80.0},
                        env=env()) for r in (0, 1)]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int], int]:
    """A results folder with records of every kind: a real measured step and the real prediction of the same
    configuration, comm points with their real α–β fit, trace and compare records, and generated records of
    every other kind (one of them from another host). Returns (folder, records per kind, step-predict pairs)."""
    out = tmp_path_factory.mktemp("study")
    spec = stepscope.get_preset("tiny", n_layers=1)
    workload = stepscope.Workload(batch=2, seq=16, mode="fwd-bwd")
    stepscope.run_step_sweep([stepscope.StepConfig(model=spec, workload=workload, device="cpu", warmup=0, iters=1,
                                                   threads=1)], out)
    point = stepscope.PredictPoint(model=spec, workload=workload, plan=stepscope.ParallelPlan(micro_batch=2))
    stepscope.run_predict(stepscope.PredictConfig(points=(point,), system="CPU"), out)
    other = stepscope.PredictPoint(model=spec, workload=stepscope.Workload(batch=2, seq=32, mode="fwd-bwd"),
                                   plan=stepscope.ParallelPlan(micro_batch=2))
    stepscope.run_predict(stepscope.PredictConfig(points=(other,), system="CPU"), out)  # no measured twin
    RecordStore(out, "step").append(make_record("step", {"model": "tiny", "seq": 4096}, status="oom", env=env(),
                                                note="out of memory"))
    special = {"comm": comm_records(), "trace": trace_records(), "compare": compare_records()}
    for kind in sorted(written_kinds() - {"step", "predict"}):
        records = special.get(kind) or generic_records(kind)
        if kind == "ddp":
            records[-1]["env"] = env("other-host")
        store = RecordStore(out, kind)
        for record in records:
            store.append(record)
    counts = {}
    for path in out.glob("*.jsonl"):
        counts[path.stem] = sum(1 for line in path.read_text().splitlines() if line.strip())
    return out, counts, 1


class Page(HTMLParser):
    """Sections (id, data-records), table rows per section and per table, SVGs per section, links, URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.current: str | None = None
        self.table: dict | None = None
        self.in_body = False
        self.hrefs: list[str] = []
        self.sources: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if "href" in attrs:
            self.hrefs.append(attrs["href"])
        if "src" in attrs:
            self.sources.append(attrs["src"])
        if tag == "section":
            self.current = attrs["id"]
            self.sections[self.current] = {"attrs": attrs, "tables": [], "svgs": 0, "warnings": []}
        elif self.current and tag == "table":
            self.table = {"attrs": attrs, "rows": 0}
            self.sections[self.current]["tables"].append(self.table)
        elif tag == "tbody":
            self.in_body = True
        elif tag == "tr" and self.in_body and self.table is not None:
            self.table["rows"] += 1
        elif tag == "svg" and self.current:
            self.sections[self.current]["svgs"] += 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.in_body = False
        elif tag == "table":
            self.table = None
        elif tag == "section":
            self.current = None


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


def test_the_source_scan_finds_the_kinds_and_each_has_a_description():
    kinds = written_kinds()
    assert {"step", "profile-category", "memory-alloc", "comm", "trace", "predict", "compare",
            "innet-bench"} <= kinds
    assert sorted(kinds - set(DESCRIPTIONS)) == []


def test_every_kind_has_a_section_with_a_row_per_record_and_a_plot(study):
    out, counts, _ = study
    page = parse(build([out]))
    for kind, count in counts.items():
        section = page.sections[f"kind-{kind}"]
        assert section["attrs"]["data-records"] == str(count)
        records_tables = [t for t in section["tables"] if "records" in t["attrs"]["class"].split()]
        assert sum(t["rows"] for t in records_tables) == count, kind
        assert section["svgs"] >= 1, kind
        assert any("environment" in t["attrs"]["class"].split() for t in section["tables"]), kind
    assert {s.removeprefix("kind-") for s in page.sections if s.startswith("kind-")} == set(counts)
    # the contents list links every section
    assert {h.removeprefix("#") for h in page.hrefs} == set(page.sections)
    # comm splits into a table of points and one of fits
    assert [t["attrs"]["data-table"] for t in page.sections["kind-comm"]["tables"][:2]] == ["point", "fit"]


def test_measured_beside_predicted_where_the_configuration_matches(study):
    out, counts, step_pairs = study
    page = parse(build([out]))
    tables = {t["attrs"]["data-match"]: t["rows"] for t in page.sections["measured-vs-predicted"]["tables"]}
    assert tables == {"step-predict": step_pairs, "comm-fit": 4, "trace-predict": 2}


def test_the_page_names_no_url_and_warns_about_mixed_environments(study):
    out, _, _ = study
    html = build([out])
    page = parse(html)
    assert "://" not in html and "url(" not in html and "@import" not in html
    assert page.sources == [] and all(h.startswith("#") for h in page.hrefs)
    assert "link" not in page.tags and "iframe" not in page.tags
    assert "mixed hostname: vm" in html and "other-host (1 records)" in html


def test_the_command_writes_the_page_and_refuses_bad_input(study, cli, tmp_path):
    out, counts, _ = study
    code, stdout, err = cli("report", out / "comm.jsonl", out / "trace.jsonl", "-o", tmp_path / "r.html")
    assert code == 0, err
    page = parse((tmp_path / "r.html").read_text())
    assert {s for s in page.sections if s.startswith("kind-")} == {"kind-comm", "kind-trace"}
    assert f"report: {tmp_path / 'r.html'}" in stdout
    code, _, err = cli("report", tmp_path / "missing", "-o", tmp_path / "x.html")
    assert code == 2 and err.count("\n") == 1 and "no such results" in err
    code, _, err = cli("report", out, "-o", tmp_path)
    assert code == 2 and "cannot write the report" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = cli("report", empty, "-o", tmp_path / "y.html")
    assert code == 2 and "no stepscope records" in err


def test_open_hands_the_page_to_the_default_browser(study, tmp_path):
    opener = tmp_path / "opener.sh"
    opener.write_text(f'#!/bin/sh\necho "$1" > {tmp_path / "opened.txt"}\n')
    opener.chmod(0o755)
    out, _, _ = study
    env = {**subprocess_env(), "BROWSER": f"{opener} %s"}
    env.pop("DISPLAY", None)
    done = subprocess.run([sys.executable, "-m", "stepscope", "report", str(out / "comm.jsonl"), "-o",
                           str(tmp_path / "r.html"), "--open"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "opened.txt").read_text().strip() == (tmp_path / "r.html").resolve().as_uri()
