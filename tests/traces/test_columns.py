"""The columnar reader (`traces/columns.py` over msgspec structs, whole or by blocks) against a reference written
from the definitions in its docstring: every event of an orjson-parsed file, one at a time, as plain dicts."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

from stepscope.traces.read import read_trace
from tests.traces.kineto import COMPUTE, GEMM, two_step_rank

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
OWN = Path(__file__).resolve().parents[1] / "data" / "traces"


def _int64(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if 2**63 <= number < 2**64:
        number -= 2**64
    return number if -2**63 <= number < 2**63 else None


def reference(path: Path) -> dict[str, Any]:
    """GPU events, runtime calls, steps and CPU-op totals of a file, event by event."""
    text = path.read_bytes()
    events = orjson.loads(gzip.decompress(text) if path.suffix == ".gz" else text)["traceEvents"]
    gpu, calls, steps, marks, ops = [], [], [], {}, {}
    for event in events:
        ts, dur = event.get("ts"), event.get("dur")
        if event.get("ph") != "X" or event.get("cat") == "Trace" or type(ts) not in (int, float) \
                or type(dur) not in (int, float):
            continue
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        stream = None if args.get("stream") is None else _int64(args["stream"])
        name = event.get("name")
        name = name if isinstance(name, str) else "" if name is None else str(name)
        if stream == -1:
            continue
        if stream is not None:
            corr = args.get("correlation")
            gpu.append((float(ts), float(dur), name, stream, -1 if corr is None else (_int64(corr) or -1)))
        elif name.startswith("ProfilerStep#"):
            if name[len("ProfilerStep#"):].isdigit():
                number = int(name[len("ProfilerStep#"):])
                marks[number] = max(float(ts), marks.get(number, float("-inf")))
                if event.get("cat") == "user_annotation":
                    steps.append((number, float(ts), float(ts + dur)))
        elif event.get("cat") in ("cpu_op", "user_annotation"):
            calls_total = ops.setdefault(name, [0, 0.0])
            calls_total[0] += 1
            calls_total[1] += dur
        elif event.get("cat") in ("cuda_runtime", "cuda_driver") and args.get("correlation") is not None:
            calls.append((_int64(args["correlation"]), float(ts), float(dur), name))
    return {"gpu": gpu, "calls": calls, "steps": sorted(steps, key=lambda s: s[1]), "marks": marks, "ops": ops}


def _columns(path: Path) -> dict[str, Any]:
    trace = read_trace(path)
    gpu = list(zip(trace.gpu_ts.tolist(), trace.gpu_dur.tolist(), [trace.names[i] for i in trace.gpu_name.tolist()],
                   trace.gpu_stream.tolist(), trace.gpu_corr.tolist(), strict=True))
    calls = list(zip(trace.launch_corr.tolist(), trace.launch_ts.tolist(), trace.launch_dur.tolist(),
                     [trace.launch_names[i] for i in trace.launch_name.tolist()], strict=True))
    return {"gpu": gpu, "calls": calls, "steps": trace.steps, "marks": trace.step_marks,
            "ops": {name: [calls, pytest.approx(total)] for name, (calls, total) in trace.cpu_ops.items()}}


def _odd_trace(tmp_path: Path) -> Path:
    """Malformed and borderline events beside good ones: a string timestamp, a kernel named by a number, a host sync
    on uint64 −1, a CPU op named `ProfilerStep#x`, names holding `}, {` (a guessed block cut that is no boundary)."""
    trace = two_step_rank().kernel("k<{lambda()#1}, {lambda()#2}>", 300, 1, launch_at=299)
    trace.kernel(GEMM, 310, 4, launch_at=305).kernel(COMPUTE, 320, 2, launch_at=306)
    trace.events[-2]["args"]["stream"] = 2**64 - 1
    trace.events.append({"ph": "X", "cat": "kernel", "name": 7, "ts": 330, "dur": 1, "args": {"stream": 7}})
    trace.events.append({"ph": "X", "cat": "kernel", "name": "late", "ts": "331", "dur": 1, "args": {"stream": 7}})
    trace.events.append({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#x", "ts": 1, "dur": 1, "args": {}})
    trace.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1,
                         "args": {"correlation": "12"}})
    return trace.write(tmp_path / "odd.json")


@pytest.mark.parametrize("blocks", [False, True])
def test_reader_keeps_what_the_definitions_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocks: bool) -> None:
    if blocks:  # every file by blocks of 256 bytes: many guessed cuts, some inside names
        monkeypatch.setattr("stepscope.traces.events.WHOLE_BYTES", 0)
        monkeypatch.setattr("stepscope.traces.events.BLOCK_BYTES", 256)
    path = _odd_trace(tmp_path)
    assert _columns(path) == reference(path)


@pytest.mark.parametrize("name", ["a100-2rank-rank0.json.gz", "v100-1rank-train.json.gz",
                                  "128rank-sampled-rank1.json.gz", "small-b8.json.gz"])
def test_reader_agrees_with_the_reference_on_real_traces(name: str) -> None:
    path = SHARED / name if (SHARED / name).exists() else OWN / name
    if not path.exists():
        pytest.skip(f"{name} is absent")
    assert _columns(path) == reference(path)
