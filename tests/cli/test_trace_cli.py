from __future__ import annotations

import json
from pathlib import Path

from tests.traces.kineto import two_step_rank


def test_trace_prints_tables_and_json(cli, tmp_path: Path) -> None:
    for r in (0, 1):
        two_step_rank(rank=r, world_size=2).write(tmp_path / f"rank{r}.json.gz")
    code, out, err = cli("trace", tmp_path / "rank0.json.gz", tmp_path / "rank1.json.gz", "--out", tmp_path / "o")
    assert code == 0, err
    assert "per rank and step" in out and "across ranks" in out and "records:" in out
    code, out, _ = cli("trace", tmp_path, "--out", tmp_path / "o2", "--format", "json", "--no-plot")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(row.get("step") == "all" and row.get("idle_pct") is not None for row in rows)
    assert not (tmp_path / "o2" / "trace.png").exists()
    code, out, _ = cli("show", tmp_path / "o" / "trace.jsonl", "--kind", "trace")
    assert code == 0 and "straggler" in out


def test_bad_trace_is_exit_2_with_one_line(cli, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("[1, 2")
    code, out, err = cli("trace", tmp_path / "bad.json", "--out", tmp_path / "o")
    assert code == 2 and err.count("\n") == 1 and "bad.json" in err
    assert not (tmp_path / "o" / "trace.jsonl").exists()
    code, _, err = cli("trace", tmp_path / "missing.json")
    assert code == 2 and "no such trace" in err


def test_compare_trace_records_with_a_prediction(cli, tmp_path: Path) -> None:
    two_step_rank().write(tmp_path / "rank0.json")
    assert cli("trace", tmp_path / "rank0.json", "--out", tmp_path / "o", "--no-plot")[0] == 0
    code, out, err = cli("compare", tmp_path / "o", "--trace", "--model", "small", "--n-layers", "2",
                         "--global-batch", "4", "--seq", "128", "--system", "A100-80GB", "--out", tmp_path / "o")
    assert code == 0, err
    assert "step_predicted_ms" in out and "comm_exposed_measured_ms" in out
