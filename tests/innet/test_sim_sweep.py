"""The simulate sweep called from Python, no command line: it writes the records the command writes, one per
config, and checks every config before it writes anything."""

import json

import pytest

from stepscope.errors import UsageError
from stepscope.innet.sim.config import SimConfig
from stepscope.innet.sim.model import simulate
from stepscope.innet.sim.sweep import run_simulate, straggler_settings
from stepscope.results.store import read_records

TINY = dict(workers=3, op_bytes=64 << 10, stall_prob=0, jitter_us=0)


def test_run_simulate_appends_one_record_per_config(tmp_path):
    configs = [SimConfig(**TINY, sto_ms=sto, k=2) for sto in (0.05, 12.5)]
    outcome = run_simulate(configs, tmp_path)
    records = read_records(tmp_path / "innet-simulate.jsonl")
    assert outcome.path == tmp_path / "innet-simulate.jsonl"
    assert [r["key"] for r in records] == [r["key"] for r in outcome.records]
    assert [r["kind"] for r in records] == ["innet-simulate"] * 2
    assert [r["config"] for r in records] == [json.loads(json.dumps(c.to_dict())) for c in configs]  # tuples: lists
    assert [r["config"]["sto_ms"] for r in records] == [0.05, 12.5] and all(r["env"]["hostname"] for r in records)
    for record, config in zip(records, configs, strict=True):
        expected = simulate(config)  # deterministic: the same counters and simulated time as a direct call
        assert {k: record["metrics"][k] for k in ("ok", "to", "sim_s", "sim_packets")} == {
            k: expected[k] for k in ("ok", "to", "sim_s", "sim_packets")}
    assert [row["k"] for row in outcome.rows] == [2, 2] and outcome.packets == sum(
        r["metrics"]["sim_packets"] for r in records)


def test_run_simulate_without_out_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome = run_simulate([SimConfig(**TINY)])
    assert outcome.path is None and len(outcome.records) == 1 and not list(tmp_path.iterdir())


def test_a_bad_config_anywhere_in_the_sweep_writes_nothing(tmp_path):
    with pytest.raises(UsageError, match="--world"):
        run_simulate([SimConfig(**TINY), SimConfig(**{**TINY, "workers": 1})], tmp_path)
    assert not list(tmp_path.iterdir())


def test_straggler_settings_add_the_delay_distribution():
    settings = straggler_settings("ranks=1,2;delay=2ms;dist=exp;steps=3")
    assert settings == dict(straggler_ranks=(1, 2), straggler_ms=2.0, straggler_prob=1.0, straggler_dist="exp",
                            straggler_steps=(3, 3))
    assert straggler_settings("ranks=0;delay=1s")["straggler_dist"] == "fixed"
