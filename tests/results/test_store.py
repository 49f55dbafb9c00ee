"""Append-only record store: crash safety (torn lines), resume keys, views."""

import json

import pytest

from stepscope.errors import UsageError
from stepscope.results.store import RecordStore, make_record, point_key, read_records
from stepscope.results.views import default_columns, record_row, render


def test_append_read_and_keys(tmp_path):
    store = RecordStore(tmp_path / "out", "step").check_writable()
    store.append(make_record("step", {"seq": 1}, {"x_ms": 1.0}))
    store.append(make_record("step", {"seq": 2}, {}, status="oom", note="CUDA out of memory"))
    store.append(make_record("step", {"seq": 3}, {}, status="error"))
    records = read_records(tmp_path / "out")
    assert [r["config"]["seq"] for r in records] == [1, 2, 3]
    assert store.done_keys() == {point_key("step", {"seq": 1}), point_key("step", {"seq": 2})}


def test_torn_last_line_is_skipped_and_next_append_is_clean(tmp_path):
    store = RecordStore(tmp_path, "step").check_writable()
    store.append(make_record("step", {"seq": 1}))
    with open(store.path, "a") as handle:
        handle.write('{"schema": "stepscope/1", "kind": "st')  # a writer killed mid-line
    store.append(make_record("step", {"seq": 2}))
    assert [r["config"]["seq"] for r in store.records()] == [1, 2]
    lines = store.path.read_text().splitlines()
    assert json.loads(lines[-1])["config"]["seq"] == 2


def test_key_is_independent_of_dict_order():
    assert point_key("k", {"a": 1, "b": 2}) == point_key("k", {"b": 2, "a": 1})
    assert point_key("k", {"a": 1}) != point_key("other", {"a": 1})


def test_views_render_every_format():
    rows = [record_row(make_record("step", {"model": "tiny", "spec": {"d": 4}}, {"t_ms": 1.23456}))]
    assert rows[0]["d"] == 4 and rows[0]["t_ms"] == 1.23456
    assert "1.235" in render(rows, fmt="table")
    assert render(rows, fmt="csv").splitlines()[0] == "kind,status,model,d,t_ms"
    assert render(rows, fmt="md").splitlines()[1].startswith("|---|")
    assert json.loads(render(rows, fmt="json"))["model"] == "tiny"


def test_out_that_is_a_file_is_refused_as_not_a_folder(tmp_path):
    import pytest

    from stepscope.errors import UsageError

    blocker = tmp_path / "passwd"
    blocker.write_text("root\n")
    with pytest.raises(UsageError, match=r"^cannot write results to .*passwd: it is a file, not a folder \(--out"):
        RecordStore(blocker, "step").check_writable()
    with pytest.raises(UsageError, match=r"passwd/sub: .*passwd is a file, not a folder"):
        RecordStore(blocker / "sub", "step").check_writable()
    assert blocker.read_text() == "root\n"


def test_record_row_env_columns_are_prefixed_and_optional():
    record = make_record("step", {"seq": 8, "threads": None}, {"t_ms": 1.0, "threads": 2},
                         env={"hostname": "vm", "threads": 2, "torch": "2.0"})
    assert not any(key.startswith("env.") for key in record_row(record))
    row = record_row(record, env=True)
    assert row["env.hostname"] == "vm" and row["env.threads"] == 2 and row["env.torch"] == "2.0"
    # a config field named like a metric keeps both: used (the metric) and asked for (None: the default)
    assert row["threads"] == 2 and row["config.threads"] is None and row["seq"] == 8
    columns = default_columns([record], [row])
    assert columns.count("threads") == 1 and "config.threads" not in columns  # the same in every row: not shown


def test_cells_that_look_like_rich_markup_print_as_they_are():
    text = render([{"op": "[param|cuda]", "note": "[/bold] x"}], fmt="table")
    assert "[param|cuda]" in text and "[/bold] x" in text


def test_remove_rewrites_without_the_selected_records_and_keeps_other_lines(tmp_path):
    store = RecordStore(tmp_path, "profile-timer").check_writable()
    for seq in (1, 2, 3):
        store.append(make_record("profile-timer", {"seq": seq}, {"x_ms": 1.0}))
    with open(store.path, "a") as handle:
        handle.write("a foreign line\n")
    store.append(make_record("profile-timer", {"seq": 4}, {}))
    assert store.remove(lambda r: r["config"]["seq"] % 2 == 0) == 2
    assert [r["config"]["seq"] for r in store.records()] == [1, 3]
    assert "a foreign line\n" in store.path.read_text()  # not a record: not ours to drop
    assert [p.name for p in tmp_path.iterdir()] == ["profile-timer.jsonl"]  # nothing left aside
    assert store.remove(lambda r: True) == 2 and store.records() == []
    assert RecordStore(tmp_path, "absent").remove(lambda r: True) == 0


def test_reading_a_folder_skips_what_is_not_a_record_file_and_reads_each_file_once(tmp_path):
    store = RecordStore(tmp_path, "step").check_writable()
    store.append(make_record("step", {"seq": 1}, {"x_ms": 1.0}))
    (tmp_path / "sub.jsonl").mkdir()  # a folder named like a record file
    (tmp_path / "old.jsonl").symlink_to(tmp_path / "gone.jsonl")  # a dangling link
    with open(store.path, "a") as handle:  # right schema, but sections that are not tables: not records
        for bad in ({"env": "x"}, {"config": "abc"}, {"metrics": [1]}, {"kind": ["a"]}):
            handle.write(json.dumps({**make_record("step", {"seq": 2}, {}), **bad}) + "\n")
    assert [r["config"]["seq"] for r in read_records(tmp_path)] == [1]
    # a folder and a file in it: the file is read once
    assert len(read_records(tmp_path, store.path, tmp_path / ".")) == 1
    with pytest.raises(UsageError, match="no such results file or folder"):
        read_records(tmp_path / "missing")


def test_a_row_without_the_metric_still_moves_its_config_field_away_from_the_metric_column():
    from stepscope.results.views import metric_names_of

    ok = make_record("step", {"threads": 4}, {"threads": 2})
    oom = make_record("step", {"threads": 8}, {}, status="oom")
    named = metric_names_of([ok, oom])
    rows = [record_row(r, metric_names=named) for r in (ok, oom)]
    assert [r.get("threads") for r in rows] == [2, None] and [r["config.threads"] for r in rows] == [4, 8]
