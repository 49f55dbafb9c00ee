"""`python -m stepscope.report.benchmark`: how long a report of a large study takes to build and how big the page
is, against the budgets (5 s and 10 MB for 10,000 records), at a tenth of the size and at full size so the
scaling shows too.

The study is generated (so the benchmark runs anywhere): step sweeps with their one-GPU predictions (every step
has a measured-vs-predicted pair), comm sweeps with their α–β fits, trace steps and profile-op rows, in the
shapes those commands write, into a temporary folder that the report then reads like any results folder."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepscope.distributed.collectives.alpha_beta import fit_records
from stepscope.report import build
from stepscope.results.store import SCHEMA, point_key

BUDGET_S = 5.0
BUDGET_MB = 10.0
ENV = {"stepscope_version": "0.1.0", "git_sha": "0000000", "python": "3.11", "hostname": "bench",
       "cpu_model": "CPU", "cores": 2, "utc_time": "2026-01-01T00:00:00+00:00", "command": "stepscope ...",
       "torch": "2.13.0+cpu", "device": "cpu", "device_name": "CPU", "threads": 2, "world_size": 1}
SPEC = {"vocab_size": 512, "context_length": 4096, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256,
        "name": "tiny"}


def _record(kind: str, config: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "kind": kind, "status": "ok", "key": point_key(kind, config), "config": config,
            "metrics": metrics, "env": ENV}


def _step_and_prediction(i: int) -> Iterator[dict[str, Any]]:
    batch, seq, mode = 1 + i % 8, 16 * (1 + (i // 8) % 64), ("fwd-bwd", "train")[(i // 512) % 2]
    workload = {"batch": batch, "seq": seq, "precision": "fp32", "mode": mode, "model_spec": {**SPEC, "n_layers":
                                                                                           2 + i // 1024}}
    ms = 0.01 * batch * seq
    stats = {f"{phase}_ms_{stat}": ms * share * (1 + 0.05 * k) for phase, share in (("forward", 0.3),
             ("backward", 0.6), ("step", 1.0)) for k, stat in enumerate(("median", "mean", "std", "min", "max"))}
    yield _record("step", {"model": "tiny", **workload, "attention": "sdpa", "warmup": 2, "iters": 5},
                  {**stats, "step_tokens_per_s": batch * seq / ms * 1e3, "step_TFLOPps": 0.01 + i % 7 / 1e3})
    plan = {"micro_batch": batch, "recompute": "none", "flash_attention": True}  # how the step ran
    yield _record("predict", {"model": "tiny", **workload, "system": "CPU", "gpus": 1, "plan": plan},
                  {"step_s": ms * 1.1e-3, "forward_ms": ms * 0.33, "backward_ms": ms * 0.62, "mfu_pct": 30.0})


def _comm(i: int) -> dict[str, Any]:
    size = 1024 * 4 ** (i % 8)
    group = i // 8
    config = {"record": "point", "backend": "gloo", "op": ("all_reduce", "all_gather", "broadcast")[group % 3],
              "world_size": 2 + group % 7, "size_bytes": size, "dtype": "fp32", "mode": "per-op",
              "in_place": True, "sweep": group // 21}
    time_us = 40 + size / 800 * (1 + 0.02 * (i % 3))
    return _record("comm", config, {"time_us_max": time_us, "time_us_mean": time_us * 0.97,
                                    "busbw_GBps": size / time_us / 1e3, "wrong": 0})


def _trace(i: int) -> dict[str, Any]:
    config = {"record": "step", "file": f"rank{i % 64}.json.gz", "rank": i % 64, "world_size": 64, "step": i // 64}
    return _record("trace", config, {"step_ms": 600.0 + i % 13, "idle_pct": 50.0 + i % 5, "comm_ms": 190.0})


def _profile_op(i: int) -> dict[str, Any]:
    return _record("profile-op", {"model": "tiny", "seq": 64 * (1 + i // 30), "phase": "fwd", "rank": i % 30},
                   {"op": f"aten::op{i % 30}", "category": "matmul", "time_ms": 1.0 + i % 30, "pct": 3.0})


def synthetic_study(records: int) -> list[dict[str, Any]]:
    """`records` records: a fifth each of steps+predictions (pairs), comm points (plus their fits), trace steps and
    profile ops."""
    per = records // 5
    out: list[dict[str, Any]] = list(itertools.chain.from_iterable(_step_and_prediction(i) for i in range(per)))
    comm = [_comm(i) for i in range(per)]
    out += comm + fit_records(comm)[0]
    out += [_trace(i) for i in range(per)]
    out += [_profile_op(i) for i in range(records - len(out))]
    return out[:records]


def measure(records: int, repeats: int) -> tuple[float, float, float, int]:
    """(median wall seconds, best wall seconds, median CPU seconds of this process, bytes) of `build` over a folder
    of `records` generated records."""
    import json

    with tempfile.TemporaryDirectory() as folder:
        by_kind: dict[str, list[str]] = {}
        for record in synthetic_study(records):
            by_kind.setdefault(record["kind"], []).append(json.dumps(record))
        for kind, lines in by_kind.items():
            (Path(folder) / f"{kind}.jsonl").write_text("\n".join(lines) + "\n")
        times, cpu, size = [], [], 0
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            html = build([folder])
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            size = len(html.encode())
    return statistics.median(times), min(times), statistics.median(cpu), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # on a shared machine the wall time counts the others' load too: the CPU time is what the build itself costs
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} cores, load average {load:.1f} at the start")
    print(f"{'records':>8} {'wall_s_median':>14} {'wall_s_best':>12} {'cpu_s_median':>13} {'size_MiB':>8} "
          f"{'wall/budget':>12} {'MB/budget':>10}")
    for records in (args.records // 10, args.records):
        median, best, cpu, size = measure(records, args.repeats)
        print(f"{records:>8} {median:>14.3f} {best:>12.3f} {cpu:>13.3f} {size / 2**20:>8.2f} "
              f"{median / BUDGET_S:>12.2f} {size / 1e6 / BUDGET_MB:>10.2f}")
    print(f"budgets: {BUDGET_S:g} s and {BUDGET_MB:g} MB for 10,000 records (median of {args.repeats} builds, "
          "reading the .jsonl files included)")


if __name__ == "__main__":
    main()
