"""`stepscope memory` end to end on the tiny model: sweep table, timeline PNGs, records, OOM rows, bad input."""

import pytest

from stepscope.results.store import read_records

TINY = ["--model", "tiny", "--batch", "2"]


def test_sweep_over_seq_and_precision_writes_tables_plots_and_records(cli, tmp_path):
    code, out, err = cli("memory", *TINY, "--n-layers", "1", "--seq", "16,64", "--precision", "fp32,bf16",
                         "--mode", "train", "--out", tmp_path, "--plot-dir", tmp_path / "plots")
    assert code == 0, err
    assert "measured: CPU allocator events" in out and "one residual-stream activation" in out
    assert "memory sweep summary" in out and "largest 10 allocations" in out
    records = read_records(tmp_path / "memory.jsonl")
    points = [(r["config"]["seq"], r["config"]["precision"], r["config"]["mode"]) for r in records]
    assert points == [(s, p, "train") for s in (16, 64) for p in ("fp32", "bf16")]
    metrics = {point[:2]: r["metrics"] for point, r in zip(points, records, strict=True)}
    for precision in ("fp32", "bf16"):
        assert metrics[(64, precision)]["peak_MiB"] > metrics[(16, precision)]["peak_MiB"]
    assert metrics[(16, "fp32")]["residual_MiB"] == pytest.approx(2 * 16 * 64 * 4 / 2**20)
    assert metrics[(16, "bf16")]["residual_MiB"] == pytest.approx(2 * 16 * 64 * 2 / 2**20)  # 2 bytes
    plots = sorted((tmp_path / "plots").glob("*.png"))
    assert len(plots) == 4 and all(p.stat().st_size > 10_000 for p in plots)
    phases = read_records(tmp_path / "memory-phase.jsonl")
    assert {r["config"]["phase"] for r in phases} == {"init", "warm-up", "forward", "backward", "optimizer"}
    assert len(read_records(tmp_path / "memory-alloc.jsonl")) == 4 * 10


def test_oom_becomes_a_row_and_resume_skips_done_points(cli, tmp_path, monkeypatch):
    import stepscope.measure.memory.benchmark as memory

    real = memory.measure_memory

    def oom_for_long_sequences(config, **kwargs):
        if config.step.workload.seq > 16:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")
        return real(config, **kwargs)

    monkeypatch.setattr(memory, "measure_memory", oom_for_long_sequences)
    code, out, err = cli("memory", *TINY, "--n-layers", "1", "--seq", "8,32,16", "--no-plot", "--out", tmp_path)
    assert code == 0, err
    records = read_records(tmp_path / "memory.jsonl")
    assert [(r["config"]["mode"], r["status"]) for r in records] == \
        [("fwd", "ok"), ("train", "ok"), ("fwd", "oom"), ("train", "oom"), ("fwd", "ok"), ("train", "ok")]
    assert "oom" in out and not list(tmp_path.glob("*.png"))
    code, out, err = cli("memory", *TINY, "--n-layers", "1", "--seq", "8,16", "--no-plot", "--out", tmp_path,
                         "--resume")
    assert code == 0 and "skipped 4 point(s)" in out
    assert len(read_records(tmp_path / "memory.jsonl")) == 6


@pytest.mark.parametrize("args, message", [
    (["--snapshot", "{tmp}/s.pickle"], "--snapshot needs a CUDA device"),
    (["--seq", "0"], "invalid value '0' in --seq"),
    (["--mode", "infer"], "invalid choice 'infer'"),
    (["--top", "0"], "invalid positive_int value"),
    (["--plot-dir", "{blocker}/plots"], "cannot write timeline plots"),
    (["--out", "{blocker}"], "is a file, not a folder (--out names a folder"),  # not "timeline plots: File exists"
])
def test_bad_input_is_one_line_exit_2_and_no_work(cli, tmp_path, args, message):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    args = [a.replace("{blocker}", str(blocker)).replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = cli("memory", *TINY, "--seq", "16", "--out", tmp_path / "out", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "memory.jsonl").exists()


def test_md_prints_the_sweep_summary_like_step_and_json_rows_carry_the_thread_count(cli, tmp_path):
    import json

    import torch

    threads = str(torch.get_num_threads())
    code, out, err = cli("memory", *TINY, "--n-layers", "1", "--seq", "16", "--no-plot", "--format", "md",
                         "--out", tmp_path)
    assert code == 0, err
    assert "**memory sweep summary (MiB)**" in out
    header, _, *rows = out.split("**memory sweep summary (MiB)**")[1].strip().splitlines()
    names = header.strip("| ").split(" | ")
    cells = [dict(zip(names, row.strip("| ").split(" | "), strict=True)) for row in rows if row.startswith("|")]
    assert [(c["mode"], c["threads"]) for c in cells] == [("fwd", threads), ("train", threads)]  # not `-`
    code, out, err = cli("memory", *TINY, "--n-layers", "1", "--seq", "8", "--mode", "fwd", "--no-plot",
                         "--format", "json", "--out", tmp_path)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and {row["threads"] for row in rows} == {int(threads)}
