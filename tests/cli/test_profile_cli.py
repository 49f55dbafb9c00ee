"""`stepscope profile` end to end on the tiny model: tables, records per table, trace, --memory, bad input."""

import csv
import io
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
    (["--out", "{blocker}"], "is a file, not a folder"),
])
def test_bad_input_is_one_line_exit_2_and_no_work(cli, tmp_path, args, message):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    args = [a.replace("{blocker}", str(blocker)) for a in args]
    code, out, err = cli("profile", *TINY, "--out", tmp_path / "out", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "profile.jsonl").exists() or read_records(tmp_path / "out") == []


@pytest.mark.parametrize("out, trace, message", [
    ("P", "P", "collides with the results folder --out P"),  # neither exists yet: the trace check alone passes
    ("P", "./P/", "collides with the results folder"),
    ("a/b", "a", "collides with the results folder --out a/b"),
    ("P", "P/profile.jsonl", "a name the results folder --out P uses for its own files"),
    ("P", "P/../P/profile-op.jsonl", "a name the results folder"),
])
def test_a_trace_colliding_with_the_results_folder_is_refused_up_front(cli, tmp_path, monkeypatch, out, trace,
                                                                       message):
    monkeypatch.chdir(tmp_path)
    code, stdout, err = cli("profile", *TINY, "--out", out, "--trace", trace)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and "trace:" not in stdout  # nothing created, no work done


def test_trace_per_point_may_not_land_on_a_results_file_and_memory_timelines_are_kept(cli, tmp_path):
    code, _, err = cli("profile", *TINY, "--seq", "8,16", "--out", tmp_path, "--trace", tmp_path / "x.jsonl")
    assert code == 2 and "x.p0.jsonl" in err  # show would read a .jsonl trace in the folder as records
    code, _, err = cli("profile", *TINY, "--memory", "--out", tmp_path, "--trace", tmp_path / "memory-t.png")
    assert code == 2 and "memory-*.png timelines" in err
    assert not list(tmp_path.iterdir())


def test_warmup_0_warns_nothing_and_csv_rows_carry_the_thread_count(cli, tmp_path):
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = cli("profile", *TINY, "--warmup", "0", "--format", "csv", "--out", tmp_path)
    assert code == 0, err
    assert not [w for w in caught if "warmup" in str(w.message)], [str(w.message) for w in caught]
    assert "Warning" not in err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and {row["threads"] for row in rows} == {str(torch.get_num_threads())}  # not blank
    summary, = read_records(tmp_path / "profile.jsonl")
    assert summary["config"]["warmup"] == 0 and summary["config"]["threads"] is None
