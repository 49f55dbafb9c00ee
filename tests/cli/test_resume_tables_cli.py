"""--resume of the commands that write several record kinds (`profile`, `memory`: a point's tables first, its
summary record last): a real SIGINT to a real sweep paused between the two, then a resume that records every
table row exactly once, and a second resume that changes no file."""

import pytest

from stepscope.measure.memory.config import TABLE_KINDS as MEMORY_TABLES
from stepscope.measure.profile.config import TABLE_KINDS as PROFILE_TABLES
from stepscope.results.store import read_records
from stepscope.results.tables import TABLES_PAUSE_ENV
from tests.conftest import STEPSCOPE, interrupt_sweep

TINY = ["--model", "tiny", "--batch", "2", "--seq", "8"]  # one point: interrupted, then measured again


@pytest.mark.parametrize("command, options, last_table, rows, tables", [
    # sdpa: the timer table is written last, 2 rows with --mode fwd
    ("profile", ["--mode", "fwd", "--active", "1", "--iters", "1"], "profile-timer", 2, PROFILE_TABLES),
    ("memory", ["--mode", "fwd", "--warmup", "0", "--top", "2", "--no-plot"], "memory-alloc", 2, MEMORY_TABLES),
])
def test_an_interruption_between_tables_and_summary_resumes_without_duplicates(cli, tmp_path, command, options,
                                                                               last_table, rows, tables):
    args = [command, *TINY, *options, "--out", str(tmp_path)]
    # the child waits after the first point's tables (before its summary): SIGINT lands exactly there
    code, err = interrupt_sweep(STEPSCOPE + args, tmp_path / f"{last_table}.jsonl", after_lines=rows, cwd=tmp_path,
                                env={TABLES_PAUSE_ENV: "300"})
    assert code == 130 and "Traceback" not in err, err
    assert read_records(tmp_path / f"{command}.jsonl") == []  # no summary yet ...
    assert len(read_records(tmp_path / f"{last_table}.jsonl")) == rows  # ... but the first point's tables

    code, out, err = cli(*args, "--resume")
    assert code == 0, err
    summaries = read_records(tmp_path / f"{command}.jsonl")
    assert [r["config"]["seq"] for r in summaries] == [8]
    written = [kind for kind in tables if (tmp_path / f"{kind}.jsonl").exists()]
    assert last_table in written
    for kind in written:
        records = read_records(tmp_path / f"{kind}.jsonl")
        keys = [r["key"] for r in records]
        assert len(keys) == len(set(keys)), f"{kind}: a table row recorded twice"
        assert {r["point"] for r in records} == {s["key"] for s in summaries}, kind  # every row has its summary
    assert len(read_records(tmp_path / f"{last_table}.jsonl")) == rows

    files = {path.name: path.read_bytes() for path in tmp_path.glob("*.jsonl")}
    code, out, err = cli(*args, "--resume")
    assert code == 0 and "skipped 1 point(s)" in out, err
    assert {path.name: path.read_bytes() for path in tmp_path.glob("*.jsonl")} == files  # nothing left to do
