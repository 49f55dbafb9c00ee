"""The speed of `stepscope trace` next to HolisticTraceAnalysis (HTA) on the same files, whole processes side by side
in one run; a large trace made by replicating a real one's steps; many rank files read one after another and by
worker processes.

    python -m stepscope.traces.benchmark [TRACE_OR_FOLDER ...] [--repeats 5] [--big-MiB 1024] [--ranks 128]

Each timing is a whole process, as a user runs it, with default options: `stepscope trace FILE --out DIR` (read,
analyse, print every table, write the records) against a Python process that runs HTA's `TraceAnalysis` on a folder
holding that one file, then `get_temporal_breakdown` and `get_comm_comp_overlap` (the same numbers there). The
repeats follow one untimed warm-up run of each and are interleaved (A B, then B A, ...), and the medians compared;
the load average is printed before and after, as the machine may be shared. The processes may write bytecode
(`PYTHONDONTWRITEBYTECODE` is dropped for them): an installed package is compiled once, not at every run. Peak RSS
is each process's own (`wait4`). HTA is optional (`pip install stepscope[hta]`); without it only stepscope's times
print. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from stepscope.results.views import render
from stepscope.traces.run import trace_files

SHARED = Path("../shared/traces")
HTA = ("import logging, sys; logging.disable(logging.WARNING); from hta.trace_analysis import TraceAnalysis; "
       "a = TraceAnalysis(trace_dir=sys.argv[1]); a.get_temporal_breakdown(visualize=False); "
       "a.get_comm_comp_overlap(visualize=False)")


def run_process(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one whole process; its output is discarded, a failure raised."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules compiled once (HTA's are, by pip), not per run
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    error = process.stderr.read().decode(errors="replace") if process.stderr else ""
    process.stderr.close()
    if process.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({process.returncode}): {error[-400:]}")
    return seconds, usage.ru_maxrss / 1024


def stepscope_command(paths: list[Path], out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "stepscope", "trace", *map(str, paths), "--out", str(out), *options]


def interleaved(commands: dict[str, list[str]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Every command once untimed (a warm-up: files cached, modules compiled), then `repeats` times, their order
    reversed every other round (A B, B A, ...)."""
    names = list(commands)
    for name in names:
        run_process(commands[name])
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            out[name].append(run_process(commands[name]))
    return out


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def versus_hta(files: list[Path], repeats: int, folder: Path) -> list[dict[str, Any]]:
    """Per file: stepscope's and HTA's median wall time and peak RSS, and HTA's time over stepscope's."""
    have_hta = importlib.util.find_spec("hta") is not None
    rows = []
    for file in files:
        alone = folder / f"hta-{file.name}"
        alone.mkdir()
        os.symlink(file.resolve(), alone / file.name)
        commands = {"stepscope": stepscope_command([file], folder / "out")}
        failed = None
        if have_hta:
            commands["hta"] = [sys.executable, "-c", HTA, str(alone)]
            try:
                run_process(commands["hta"])
            except RuntimeError as error:  # a trace HTA cannot analyse is a row that says so
                failed = str(error).strip().splitlines()[-1][:80]
                del commands["hta"]
        before = load()
        times = interleaved(commands, repeats)
        ours = statistics.median(t for t, _ in times["stepscope"])
        row: dict[str, Any] = {"file": file.name, "MiB": _text_MiB(file), "stepscope_s": ours,
                               "stepscope_RSS_MiB": max(m for _, m in times["stepscope"])}
        if failed:
            row["hta_s"] = f"failed: {failed}"
        elif have_hta:
            theirs = statistics.median(t for t, _ in times["hta"])
            row.update({"hta_s": theirs, "hta_RSS_MiB": max(m for _, m in times["hta"]), "speedup": theirs / ours})
        rows.append({**row, "load_before": before, "load_after": load()})
    return rows


def _text_MiB(path: Path) -> float:
    from stepscope.traces.read_dicts import text_size

    return text_size(path) / 2**20


def replicate(source: Path, target: Path, size_MiB: float) -> tuple[int, int]:
    """Write an uncompressed trace of about `size_MiB` by repeating `source`'s events, each copy shifted past the
    previous one in time, correlation ids and step numbers. Returns (events, bytes)."""
    data = orjson.loads(_read(source))
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


def _read(path: Path) -> bytes:
    return gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()


def big_trace(source: Path, size_MiB: float, folder: Path) -> dict[str, Any]:
    """`stepscope trace` on `source`'s steps replicated to `size_MiB` of JSON: wall time and peak RSS."""
    target = folder / f"big-{source.name.split('.')[0]}.json"
    events, size = replicate(source, target, size_MiB)
    before = load()
    seconds, peak = run_process(stepscope_command([target], folder / "out-big"))
    target.unlink()
    return {"file": target.name, "MiB": size / 2**20, "events": events, "stepscope_s": seconds,
            "events_per_s": events / seconds, "peak_RSS_MiB": peak, "load_before": before, "load_after": load()}


def rank_files(source: Path, ranks: int, folder: Path) -> list[Path]:
    """`ranks` gzipped copies of `source`, each naming its rank of a job of `ranks`."""
    data = orjson.loads(_read(source))
    out = []
    for rank in range(ranks):
        data["distributedInfo"] = dict(data.get("distributedInfo") or {}, rank=rank, world_size=ranks)
        path = folder / f"rank{rank:04d}.json.gz"
        path.write_bytes(gzip.compress(orjson.dumps(data), compresslevel=1))
        out.append(path)
    return out


def many_ranks(source: Path, ranks: int, repeats: int, folder: Path) -> list[dict[str, Any]]:
    """The same `ranks` rank files read by one process (`--workers 1`) and by one worker per core (the default)."""
    from stepscope.host import usable_cores

    files = folder / "ranks"
    files.mkdir()
    rank_files(source, ranks, files)
    commands = {"serial": stepscope_command([files], folder / "out-serial", "--workers", "1"),
                "parallel": stepscope_command([files], folder / "out-parallel")}
    before = load()
    times = interleaved(commands, repeats)
    medians = {name: statistics.median(t for t, _ in runs) for name, runs in times.items()}
    shutil.rmtree(files)
    return [{"ranks": ranks, "file": source.name, "workers": 1 if name == "serial" else min(usable_cores(), ranks),
             "stepscope_s": medians[name], "per_rank_ms": 1e3 * medians[name] / ranks,
             "peak_RSS_MiB": max(m for _, m in times[name]), "speedup": medians["serial"] / medians[name],
             "load_before": before, "load_after": load()} for name in commands]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepscope.traces.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=[str(SHARED)], help="traces or folders (default ../shared/traces)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each process (medians)")
    parser.add_argument("--big-MiB", type=float, default=1024.0, help="size of the replicated trace (0: none)")
    parser.add_argument("--big-source", default=None, help="trace to replicate (default: the largest given)")
    parser.add_argument("--ranks", type=int, default=128, help="rank files read serially and in parallel (0: none)")
    parser.add_argument("--rank-source", default=None, help="the rank file copied (default: the first given whose "
                        "name says rank0, else the smallest)")
    args = parser.parse_args(argv)

    files = [f for f in trace_files(args.paths) if f.name != "hta_reference.json"]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {load()}")
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        rows = versus_hta(files, args.repeats, folder)
        print(render(rows, title=f"whole processes, default options, median of {args.repeats} interleaved: "
                                 "`stepscope trace FILE --out DIR` vs HTA (TraceAnalysis + get_temporal_breakdown + "
                                 "get_comm_comp_overlap)"))
        if args.big_MiB > 0:
            source = Path(args.big_source) if args.big_source else max(files, key=lambda f: f.stat().st_size)
            print(render([big_trace(source, args.big_MiB, folder)],
                         title=f"a large trace: {source.name}'s steps replicated, one whole process"))
        if args.ranks > 0:
            named = [f for f in files if "rank0" in f.name]
            source = Path(args.rank_source) if args.rank_source else (named or sorted(files, key=lambda f:
                                                                                     f.stat().st_size))[0]
            print(render(many_ranks(source, args.ranks, max(1, args.repeats // 2), folder),
                         title=f"{args.ranks} rank files: one process after another vs worker processes"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
