"""`stepscope ddp` end to end on the tiny model (one launch of 2 ranks), then bad input (no launch)."""

import pytest

from stepscope.host import usable_cores
from stepscope.results.store import read_records

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--warmup", "0", "--iters", "2", "--comm-iters", "1"]


def test_benchmark_runs_records_every_variant_and_writes_the_plot(cli, tmp_path):
    plot = tmp_path / "plots" / "ddp.png"
    code, out, err = cli("ddp", *TINY, "--bucket-MiB", "0.01,none", "--shard-optimizer", "--out", tmp_path,
                         "--plot", plot)
    assert code == 0, err
    records = read_records(tmp_path / "ddp.jsonl")
    labels = [(r["config"]["variant"], r["config"]["bucket_MiB"]) for r in records]
    assert labels == [("compute", None), ("naive", None), ("flat", None), ("individual", None),
                      ("bucketed", 0.01), ("bucketed", None), ("torch", 0.01), ("torch", None)]
    assert all(r["status"] == "ok" for r in records), [r["metrics"].get("max_rel_error") for r in records]
    for record in records:
        metrics = record["metrics"]
        assert metrics["step_ms_median"] > 0 and metrics["compute_step_ms_median"] > 0
        assert metrics["optimizer_MiB_after_step_sharded"] < metrics["optimizer_MiB_after_step"]
        assert metrics["optimizer_MiB_init"] == 0 and metrics["params_MiB_init"] > 0
        assert metrics["allreduce_alpha_ms"] > 0 and metrics["bstar_MiB"] > 0
        assert record["config"]["shard_optimizer"] is True and record["env"]["world_size"] == 2
        assert 0 < metrics["step_cores_busy"] <= usable_cores() + 0.5  # CPU time / wall time of one rank
    by_label = {label: r["metrics"] for label, r in zip(labels, records, strict=True)}
    assert by_label[("bucketed", None)]["n_buckets"] == 1 and by_label[("flat", None)]["n_buckets"] == 1
    assert by_label[("bucketed", 0.01)]["n_buckets"] > 1
    assert {"exposed_comm_ms", "exposed_comm_fraction", "overlap_fraction", "comm_alone_ms_median",
            "step_ratio_vs_torch"} <= set(by_label[("bucketed", 0.01)])
    assert plot.stat().st_size > 10_000
    assert "best DDPBucketed" in out and "x torch " in out and "x naive" in out and "b* = sqrt(s*w*alpha)" in out
    assert "ShardedOptimizer(AdamW)" in out and "core(s) per rank busy" in out
    # --resume finds every record of the point and launches nothing
    code, out, err = cli("ddp", *TINY, "--bucket-MiB", "0.01,none", "--shard-optimizer", "--out", tmp_path,
                         "--no-plot", "--resume")
    assert code == 0 and "skipped 1 point" in out
    assert len(read_records(tmp_path / "ddp.jsonl")) == len(records)


def test_a_point_that_does_not_fit_is_an_oom_row_per_variant(cli, tmp_path):
    # 2e10 sequences: the ranks cannot hold the data, agree on it before any collective, and the sweep records it
    code, out, err = cli("ddp", "--model", "tiny", "--batch", "20000000000", "--seq", "16", "--variants", "flat",
                         "--bucket-MiB", "none", "--iters", "1", "--warmup", "0", "--comm-iters", "1", "--no-plot",
                         "--out", tmp_path)
    assert code == 0, err
    records = read_records(tmp_path / "ddp.jsonl")
    assert [(r["config"]["variant"], r["status"]) for r in records] == [("compute", "oom"), ("flat", "oom")]
    assert "oom: global batch 20000000000" in out and "allocate" in records[0]["note"]


@pytest.mark.parametrize("args, message", [
    (["--batch", "3"], "not divisible by world size 2"),
    (["--variants", "naive,fast"], "invalid choice 'fast'"),
    (["--bucket-MiB", "0"], "invalid value '0' in --bucket-MiB"),
    (["--bucket-MiB", "10,,1"], "malformed list"),
    (["--bucket-MiB", "inf"], "bucket sizes must be positive MiB up to"),
    (["--world", "0"], "invalid value '0' in --world"),
    (["--world", "2,4"], "--world takes one value"),
    (["--precision", "fp8"], "invalid choice 'fp8'"),
    (["--bucket-rule", "loose"], "invalid choice 'loose'"),
    (["--backend", "nccl"], "needs CUDA GPUs"),
    (["--seq", "4096"], "exceeds the model's context_length"),
    (["--model", "gpt5"], "unknown model preset"),
])
def test_bad_input_is_one_line_exit_2_and_no_record(cli, tmp_path, args, message):
    argv = {"--model": "tiny", "--batch": "2", "--seq": "16"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        argv[flag] = value
    code, out, err = cli("ddp", *[item for pair in argv.items() for item in pair], "--out", tmp_path)
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "ddp.jsonl").exists()


def test_too_many_local_ranks_names_oversubscribe_which_lifts_the_cap(cli, tmp_path, monkeypatch):
    from stepscope.distributed.launch.ranks import OVERSUBSCRIBE_ENV

    monkeypatch.delenv(OVERSUBSCRIBE_ENV, raising=False)
    base = ["ddp", "--model", "tiny", "--seq", "16", "--out", tmp_path]
    code, _, err = cli(*base, "--world", "99999")
    assert code == 2 and "--oversubscribe" in err and "99999 local ranks" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # with the flag the cap is gone: the next check (batch split) speaks, still before any rank starts
    code, _, err = cli(*base, "--world", "99999", "--oversubscribe")
    assert code == 2 and "not divisible by world size 99999" in err and "--oversubscribe" not in err
    assert not (tmp_path / "ddp.jsonl").exists()
