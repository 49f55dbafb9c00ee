"""A refused command leaves nothing behind: exit code 2, one line on stderr, no folder and no empty record file
(`results.files.remove_created`; the library validates its inputs before it creates an output where it can)."""

import json
from pathlib import Path

import pytest
import torch

from stepscope.results.files import check_writable_file, remove_created
from stepscope.results.store import RecordStore


def _everything(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(cli, tmp_path: Path, *args, message: str) -> None:
    before = _everything(tmp_path)
    code, _, err = cli(*args)
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert _everything(tmp_path) == before  # the --out folder, record files and --system-out: none of them


def test_a_bad_trace_leaves_no_out_folder(cli, tmp_path):
    (tmp_path / "bad.json").write_text('{"bad": 1}')
    _refused(cli, tmp_path, "trace", tmp_path / "bad.json", "--out", tmp_path / "out", message="not a PyTorch "
             "profiler trace")


def test_calibrate_without_usable_records_leaves_no_record_file(cli, tmp_path):
    (tmp_path / "records").mkdir()
    _refused(cli, tmp_path, "calibrate", tmp_path / "records", "--out", tmp_path / "out", "--system-out",
             tmp_path / "sys" / "fitted.toml", message="no usable step records")


def test_calibrate_with_a_wrong_rates_file_leaves_no_record_file(cli, tmp_path):
    (tmp_path / "rates.json").write_text(json.dumps({"rows": [{"family": "dense"}]}))
    _refused(cli, tmp_path, "calibrate", "--rates", tmp_path / "rates.json", "--out", tmp_path / "out",
             "--system-out", tmp_path / "out" / "fitted.toml", message="is not an op-rates file")


@pytest.mark.skipif(torch.cuda.is_available(), reason="nccl runs where there are GPUs")
def test_moe_on_nccl_without_a_gpu_leaves_no_record_file(cli, tmp_path):
    _refused(cli, tmp_path, "moe", "--backend", "nccl", "--out", tmp_path / "out", message="backend nccl needs")


def test_what_the_checks_created_goes_only_while_empty(tmp_path):
    """The clean-up takes back empty files and folders the checks made, never a finished point or an older file."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "old.jsonl").write_text("")
    RecordStore(tmp_path / "kept", "old").check_writable()  # existed before: not ours
    RecordStore(tmp_path / "a" / "b", "empty").check_writable()
    full = RecordStore(tmp_path / "full", "done").check_writable()
    full.append({"schema": "stepscope/1", "kind": "done"})
    check_writable_file(tmp_path / "c" / "d" / "plot.png", "the plot")
    remove_created()
    assert _everything(tmp_path) == {"kept", "kept/old.jsonl", "full", "full/done.jsonl"}
