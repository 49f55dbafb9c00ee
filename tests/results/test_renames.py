"""Records written before a field was renamed read under today's names and units (results.renames), by hand."""

import json

import pytest

from stepscope.results.store import read_records


def test_old_names_and_units_read_as_todays(tmp_path):
    old = {"schema": "stepscope/1", "kind": "step", "status": "ok", "key": "k",
           "config": {"bucket_mb": 25.0, "link_gbps": 100.0},
           "metrics": {"step_GFLOPps": 250.0, "GFLOPps": 1500.0, "innet_algbw_Gbps": 80.0, "link_Gbps": 100.0,
                       "size_B": 4096, "tflops_per_gpu": 400.0, "step_ms_median": 12.5,
                       "tables": [{"sent_B": 64, "gbps": 3.5, "flag": True}]}}
    bench = {"schema": "stepscope/1", "kind": "innet-bench", "status": "ok", "key": "b",
             "config": {"dtype": "i32"}, "metrics": {}}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(bench) + "\n")
    record, innet = read_records(path)
    assert record["config"] == {"bucket_MiB": 25.0, "link_Gbps": 100.0}  # a link's line rate stays in bits
    metrics = record["metrics"]
    assert metrics["step_TFLOPps"] == pytest.approx(0.25) and metrics["TFLOPps"] == pytest.approx(1.5)
    assert metrics["innet_algbw_GBps"] == pytest.approx(10.0)  # 80 gigabits are 10 gigabytes
    assert metrics["link_Gbps"] == 100.0 and metrics["size_bytes"] == 4096 and metrics["step_ms_median"] == 12.5
    assert metrics["TFLOPps_per_gpu"] == 400.0
    assert metrics["tables"] == [{"sent_bytes": 64, "GBps": 3.5, "flag": True}]
    assert not any(k.endswith(("GFLOPps", "_B")) for k in metrics)
    assert innet["config"]["dtype"] == "int32"
