"""`stepscope moe`: the expert-parallel layer on 2 spawned gloo ranks equals the single-process layer (with
capacity drops and a shared expert), every piece is timed, the record is written; bad input costs no spawn."""

import pytest

from stepscope.distributed.expert_parallel.config import EPConfig
from stepscope.spec import get_preset


def test_two_ranks_equal_the_reference_and_every_piece_is_timed(cli, tmp_path):
    code, out, err = cli("moe", "--model", "tiny-moe", "--capacity-factor", "1.25", "--router", "sigmoid",
                         "--ep", "2", "--tokens", "96", "--warmup", "1", "--iters", "3", "--threads", "1",
                         "--out", tmp_path)
    assert code == 0, err
    assert "output equals the single-process layer" in out
    from stepscope.results.store import read_records

    record = read_records(tmp_path / "moe-ep.jsonl")[0]
    metrics, config = record["metrics"], record["config"]
    assert config["ep"] == 2 and config["model_spec"]["capacity_factor"] == 1.25 and record["env"]["world_size"] == 2
    assert metrics["max_abs_error"] <= 1e-5
    for piece in ("router", "dispatch", "experts", "combine", "shared", "layer"):
        assert metrics[f"{piece}_ms_median"] > 0 and metrics[f"{piece}_n"] == 3
    spec = get_preset("tiny-moe")
    # capacity 1.25 x 96 x 2 / 4 = 60 rows per expert: at most 4 x 60 of the 192 assignments are sent
    assert 0 < metrics["dispatch_bytes"] <= 96 * 2 * spec.d_model * 4
    assert metrics["load_max_over_mean"] >= 1.0


@pytest.mark.parametrize("args, message", [
    (["--ep", "3"], "--ep 3 must divide n_experts=4"),
    (["--model", "tiny"], "has no experts"),
    (["--ep", "2,4"], "--ep takes one value"),
    (["--timeout", "inf"], "invalid value 'inf' in --timeout"),
    (["--capacity-factor", "inf"], "capacity_factor must be 0 (dropless) or between 1 and 1000"),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, args, message):
    code, out, err = cli("moe", *args, "--out", tmp_path)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "moe-ep.jsonl").exists()


def test_config_defaults_validate():
    EPConfig().validate()


def test_a_wrong_expert_parallel_output_fails_the_run_and_is_not_kept_as_ok(cli, tmp_path, monkeypatch):
    from stepscope.distributed.expert_parallel import benchmark
    from stepscope.measure.stats import Stats
    from stepscope.results.store import read_records

    def wrong(config):  # what a broken dispatch or combine reports: an output off by its own size
        pieces = {piece: Stats.of([1e-3, 2e-3]) for piece in (*benchmark.PIECES, "layer")}
        return benchmark.EPResult(config=config, pieces=pieces, max_abs_error=1.0, dispatch_bytes=1024, dispatch_rows=4,
                                  dropped=0,
                                  load_max_over_mean=1.0, threads=1)

    monkeypatch.setattr(benchmark, "benchmark_ep", wrong)
    code, out, err = cli("moe", "--iters", "2", "--out", tmp_path)
    assert code == 1 and "output DIFFERS from" in out and "equals" not in out
    (record,) = read_records(tmp_path / "moe-ep.jsonl")
    assert record["status"] == "mismatch" and "DIFFERS" in record["note"]
    assert wrong(EPConfig()).max_abs_error > benchmark.MATCH_TOLERANCE >= 1e-5
