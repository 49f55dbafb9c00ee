"""`stepscope profile` end to end on the tiny model: tables, records per table, trace, --memory, bad input."""

import json

import pytest

from stepscope.results.store import read_records

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--active", "1", "--iters", "1"]


def test_profile_prints_every_table_and_records_them(cli, tmp_path):
    trace = tmp_path / "traces" / "trace.json"
    code, out, err = cli("profile", *TINY, "--attention", "naive", "--trace", trace, "--out", tmp_path)
    assert code == 0, err
    for title in ("forward: ", "forward+backward: ", "train step: ", "top 10 ops", "share of time in matmuls",
                  "timer (no profiler) vs profiler", "naive attention pieces", "score matmul", f"trace: {trace}"):
        assert title in out, title
    assert json.loads(trace.read_text())["traceEvents"]
    summary, = read_records(tmp_path / "profile.jsonl")
    assert summary["status"] == "ok" and summary["config"]["attention"] == "naive"
    assert summary["metrics"]["train_other_pct"] < 5 and summary["metrics"]["step_timer_ms"] > 0
    categories = read_records(tmp_path / "profile-category.jsonl")
    assert {r["config"]["phase"] for r in categories} == {"fwd", "fwd-bwd", "train"}
    assert all(r["config"]["model"] == "tiny" and "time_ms" in r["metrics"] for r in categories)
    assert len(read_records(tmp_path / "profile-attention.jsonl")) == 3
    for kind in ("profile-op", "profile-share", "profile-timer"):
        assert read_records(tmp_path / f"{kind}.jsonl"), kind
    code, out, _ = cli("show", tmp_path / "profile-category.jsonl", "--group-by", "phase",
                       "--columns", "category,time_ms,pct")
    assert code == 0 and "phase=train" in out and "optimizer" in out


def test_sweep_json_output_with_memory(cli, tmp_path):
    code, out, err = cli("profile", *TINY, "--seq", "8,16", "--mode", "fwd", "--memory", "--format", "json",
                         "--trace", tmp_path / "t.json", "--out", tmp_path)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert {row["table"] for row in rows} >= {"profile-category", "profile-timer", "memory-phase", "memory-alloc"}
    assert {row["seq"] for row in rows} == {8, 16}
    assert (tmp_path / "t.p0.json").exists() and (tmp_path / "t.p1.json").exists()
    assert [r["config"]["seq"] for r in read_records(tmp_path / "memory.jsonl")] == [8, 16]
    assert len(list(tmp_path.glob("memory-tiny-*.png"))) == 2


@pytest.mark.parametrize("args, message", [
    (["--active", "0"], "invalid positive_int value"),
    (["--wait", "-1"], "invalid non_negative_int value"),
    (["--seq", "4096"], "exceeds the model's context_length"),
    (["--attention", "magic"], "unknown attention backend"),
    (["--precision", "fp8"], "invalid choice 'fp8'"),
    (["--nvtx"], "--nvtx needs a CUDA device"),
    (["--trace", "{blocker}/trace.json"], "cannot write the trace"),
    (["--out", "{blocker}/out"], "cannot write results"),
])
def test_bad_input_is_one_line_exit_2_and_no_work(cli, tmp_path, args, message):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    args = [a.replace("{blocker}", str(blocker)) for a in args]
    code, out, err = cli("profile", *TINY, "--out", tmp_path / "out", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "profile.jsonl").exists() or read_records(tmp_path / "out") == []
