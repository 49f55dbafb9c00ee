"""`stepscope show`: --group-by in machine-readable output, environment columns, unknown columns."""

import csv
import io
import json

import pytest

from stepscope.results.store import RecordStore, make_record


def _write_records(out):
    """Four step-like records: seq x iters, from two hosts (one per iters value)."""
    store = RecordStore(out, "step").check_writable()
    for iters, host in ((1, "node-a"), (2, "node-b")):
        for seq in (16, 32):
            env = {"hostname": host, "torch": "2.0", "git_sha": "abc123", "utc_time": "2025-01-01T00:00:00+00:00",
                   "threads": 4}
            store.append(make_record("step", {"model": "tiny", "seq": seq, "iters": iters, "threads": None},
                                     {"step_ms_median": seq * 10.0 + iters, "threads": 4}, env=env))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_group_by_columns_stay_on_every_row_in_csv_and_json(cli, tmp_path, fmt):
    _write_records(tmp_path)
    code, out, err = cli("show", tmp_path, "--columns", "model,seq,step_ms_median", "--group-by", "iters",
                         "--format", fmt)
    assert code == 0, err
    if fmt == "csv":
        assert out.splitlines()[0] == "iters,model,seq,step_ms_median"  # one header, the group first
        rows = [{k: float(v) if k != "model" else v for k, v in row.items()}
                for row in csv.DictReader(io.StringIO(out))]
    else:
        rows = [json.loads(line) for line in out.splitlines()]
    # every row can be told apart: its group's value is on it, and it matches the record
    assert [(row["iters"], row["seq"]) for row in rows] == [(1, 16), (1, 32), (2, 16), (2, 32)]
    assert all(row["step_ms_median"] == row["seq"] * 10 + row["iters"] for row in rows)


def test_group_by_tables_keep_titles(cli, tmp_path):
    _write_records(tmp_path)
    code, out, _ = cli("show", tmp_path, "--columns", "seq,step_ms_median", "--group-by", "iters", "--format", "md")
    assert code == 0 and "**iters=1**" in out and "**iters=2**" in out
    assert out.splitlines()[2] == "| seq | step_ms_median |"


def test_environment_fields_are_columns_and_groups(cli, tmp_path):
    _write_records(tmp_path)
    code, out, err = cli("show", tmp_path, "--columns", "seq,env.hostname,env.torch,env.git_sha,env.utc_time,"
                         "env.threads", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [row["env.hostname"] for row in rows] == ["node-a", "node-a", "node-b", "node-b"]
    assert {(row["env.torch"], row["env.git_sha"], row["env.threads"]) for row in rows} == {("2.0", "abc123", "4")}
    assert rows[0]["env.utc_time"].startswith("2025-01-01")
    code, out, err = cli("show", tmp_path, "--columns", "seq,iters", "--group-by", "env.hostname", "--format", "md")
    assert code == 0 and "**env.hostname=node-a**" in out and "**env.hostname=node-b**" in out
    code, out, _ = cli("show", tmp_path, "--columns", "all", "--format", "csv")
    assert code == 0 and "env." not in out.splitlines()[0]  # `all` stays config and metrics


@pytest.mark.parametrize("args, message", [
    (["--columns", "seq,hostname"], "unknown column 'hostname' (environment fields are prefixed: env.hostname)"),
    (["--columns", "env.nope"], "unknown column 'env.nope'"),
    (["--group-by", "env.nope"], "unknown --group-by column 'env.nope'"),
])
def test_unknown_columns_are_one_line_listing_what_exists(cli, tmp_path, args, message):
    _write_records(tmp_path)
    code, out, err = cli("show", tmp_path, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""
    assert "available: " in err and "env.hostname" in err and "step_ms_median" in err
