"""The speed of `stepscope trace` next to HolisticTraceAnalysis (HTA) on the same files, in one run, and a large
trace made by replicating the steps of a real one, read as a stream in a child process whose peak memory is reported.

    python -m stepscope.traces.benchmark [TRACE_OR_FOLDER ...] [--repeats 3] [--big-MiB 1024]

stepscope's time: read + analyse (what `stepscope trace` does, without printing); HTA's: `TraceAnalysis` of a folder
holding that one file + `get_temporal_breakdown` + `get_comm_comp_overlap` (what the same numbers cost there). Both
medians of `--repeats`. HTA is optional (`pip install stepscope[hta]`); without it only stepscope's times print.
A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from stepscope.results.views import render
from stepscope.traces.analyze import analyze
from stepscope.traces.read import read_trace
from stepscope.traces.run import trace_files

SHARED = Path("../shared/traces")


def time_stepscope(path: Path, repeats: int) -> tuple[float, int]:
    times, events = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        trace = read_trace(path)
        analyze(trace)
        times.append(time.perf_counter() - start)
        events = trace.events
    return statistics.median(times), events


def time_hta(path: Path, repeats: int) -> float | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    logging.disable(logging.WARNING)
    times = []
    with tempfile.TemporaryDirectory() as folder:
        os.symlink(path.resolve(), Path(folder) / path.name)
        for _ in range(repeats):
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                analysis = TraceAnalysis(trace_dir=folder)
                analysis.get_temporal_breakdown(visualize=False)
                analysis.get_comm_comp_overlap(visualize=False)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def replicate(source: Path, target: Path, size_MiB: float) -> tuple[int, int]:
    """Write an uncompressed trace of about `size_MiB` by repeating `source`'s events, each copy shifted past the
    previous one in time, correlation ids and step numbers. Returns (events, bytes)."""
    data = orjson.loads(read_bytes(source))
    events = data.pop("traceEvents")
    times = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), int | float)]
    first = min(e["ts"] for e in events if isinstance(e.get("ts"), int | float))
    period = max(times) - first + 1000.0
    steps = [int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_shift = (max(steps) - min(steps) + 1) if steps else 0
    written, count, copy = 0, 0, 0
    with open(target, "wb") as out:
        head = orjson.dumps(data)[:-1]
        out.write(head + (b', "traceEvents": [\n' if len(head) > 1 else b'"traceEvents": [\n'))
        while written < size_MiB * 2**20:
            chunk = []
            for event in events:
                e = dict(event)
                if isinstance(e.get("ts"), int | float):
                    e["ts"] = e["ts"] + copy * period
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e["args"] = dict(args, correlation=args["correlation"] + copy * 10_000_000)
                if step_shift and str(e.get("name", "")).startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + copy * step_shift}"
                chunk.append(orjson.dumps(e))
            text = (b",\n" if copy else b"") + b",\n".join(chunk)
            out.write(text)
            written += len(text)
            count += len(chunk)
            copy += 1
        out.write(b"\n]}\n")
    return count, target.stat().st_size


def read_bytes(path: Path) -> bytes:
    import gzip

    return gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()


def big_trace(source: Path, size_MiB: float) -> dict[str, Any]:
    """Replicate `source` to `size_MiB`, then time `stepscope trace` on it in a child process (peak memory)."""
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / f"big-{source.name.split('.')[0]}.json"
        events, size = replicate(source, target, size_MiB)
        code = ("import resource, sys, time; from stepscope.traces.run import run_trace; "
                "from stepscope.traces.config import TraceConfig; t = time.perf_counter(); "
                f"o = run_trace(TraceConfig(paths=({str(target)!r},)), None); "
                "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
                "len(o.ranks[0].steps), o.ranks[0].total.breakdown.metrics()['idle_pct'])")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        seconds, peak_kib, steps, idle = result.stdout.split()
    return {"file": target.name, "MiB": size / 2**20, "events": events, "steps": int(steps),
            "stepscope_s": float(seconds), "events_per_s": events / float(seconds),
            "peak_RSS_MiB": int(peak_kib) / 1024, "idle_pct": float(idle)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepscope.traces.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=[str(SHARED)], help="traces or folders (default ../shared/traces)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big-MiB", type=float, default=1024.0, help="size of the replicated trace (0: none)")
    parser.add_argument("--big-source", default=None, help="trace to replicate (default: the largest given)")
    args = parser.parse_args(argv)

    files = [f for f in trace_files(args.paths) if f.name != "hta_reference.json"]
    rows, ours_total, theirs_total = [], 0.0, 0.0
    for file in files:
        ours, events = time_stepscope(file, args.repeats)
        theirs = time_hta(file, args.repeats)
        rows.append({"file": file.name, "events": events, "stepscope_s": ours, "hta_s": theirs,
                     "stepscope_events_per_s": events / ours, "hta_events_per_s": events / theirs if theirs else None,
                     "speedup": theirs / ours if theirs else None})
        ours_total += ours
        theirs_total += theirs or 0.0
    if theirs_total:
        rows.append({"file": "all", "events": sum(r["events"] for r in rows), "stepscope_s": ours_total,
                     "hta_s": theirs_total, "speedup": theirs_total / ours_total})
    print(render(rows, title="read + temporal breakdown + communication overlap, median of "
                             f"{args.repeats} (HTA: TraceAnalysis + get_temporal_breakdown + get_comm_comp_overlap)"))
    if args.big_MiB > 0:
        source = Path(args.big_source) if args.big_source else max(files, key=lambda f: f.stat().st_size)
        print(render([big_trace(source, args.big_MiB)], title=f"a large trace: {source.name}'s steps replicated, "
                                                              "read as a stream in a child process"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
