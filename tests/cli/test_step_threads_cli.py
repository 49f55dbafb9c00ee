"""`stepscope step` machine-readable output names the thread count a point ran with, also without --threads."""

import csv
import io
import json

import torch

from stepscope.results.store import read_records

TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--warmup", "0", "--iters", "1"]


def test_csv_and_json_rows_carry_the_effective_thread_count(cli, tmp_path):
    threads = torch.get_num_threads()
    code, out, err = cli("step", *TINY, "--format", "csv", "--out", tmp_path)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4 and {row["threads"] for row in rows} == {str(threads)}  # was blank
    record, = read_records(tmp_path / "step.jsonl")
    assert record["config"]["threads"] is None and record["metrics"]["threads"] == threads
    code, out, err = cli("step", *TINY, "--seq", "8", "--format", "json", "--out", tmp_path)
    assert code == 0, err
    assert {json.loads(line)["threads"] for line in out.splitlines()} == {threads}
