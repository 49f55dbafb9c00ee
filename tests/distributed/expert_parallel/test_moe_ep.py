"""`stepscope moe`: the expert-parallel layer on 2 spawned gloo ranks equals the single-process layer (with
capacity drops, asserted from an independent router, and a shared expert) and sends exactly the kept
assignments, every piece is timed, the record is written; bad input costs no spawn."""

import pytest

from stepscope.distributed.expert_parallel.config import EPConfig
from stepscope.spec import get_preset


def expected_dispatch(config: EPConfig) -> tuple[int, int, list[int], list[int]]:
    """(rows all ranks send, assignments the capacity drops, rows each rank sends, kept assignments per expert
    over all ranks) for the benchmark's seeded block and tokens, from the independent per-token router of
    tests/nn (no stepscope routing code)."""
    import torch

    from stepscope.nn.moe import MoE
    from stepscope.nn.transformer import MLP
    from tests.nn.moe_equations import route

    torch.manual_seed(config.seed)  # the block every rank builds
    block = MoE(config.model, "reference", shared=MLP)
    kept = dropped = 0
    per_rank, per_expert = [], [0] * config.model.n_experts
    for rank in range(config.ep):
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + rank)
        x = torch.randn(config.tokens, config.model.d_model, generator=generator)
        bias = getattr(block.router, "bias", None)
        plan, _ = route(x.double(), block.router.gate.weight.detach().double(), config.model.router,
                        config.model.experts_per_token, bias=None if bias is None else bias.double(),
                        capacity_factor=config.model.capacity_factor)
        kept += sum(c.kept for choices in plan for c in choices)
        dropped += sum(not c.kept for choices in plan for c in choices)
        per_rank.append(sum(c.kept for choices in plan for c in choices))
        for c in (c for choices in plan for c in choices if c.kept):
            per_expert[c.expert] += 1
    return kept, dropped, per_rank, per_expert


def test_two_ranks_equal_the_reference_send_only_kept_rows_and_time_every_piece(cli, tmp_path):
    """Capacity 1.0 on 96 tokens per rank: the seed is chosen so that the capacity drops assignments on both ranks
    (asserted first, from the independent router); an expert-parallel layer that sent a dropped assignment would
    send more rows than the kept ones, whatever its output."""
    config = EPConfig(model=get_preset("tiny-moe", capacity_factor=1.0, router="sigmoid"), tokens=96, seed=0)
    kept, dropped, per_rank, per_expert = expected_dispatch(config)
    assert dropped > 0 and kept + dropped == 2 * 96 * 2
    code, out, err = cli("moe", "--model", "tiny-moe", "--capacity-factor", "1", "--router", "sigmoid",
                         "--ep", "2", "--tokens", "96", "--warmup", "1", "--iters", "3", "--threads", "1",
                         "--out", tmp_path)
    assert code == 0, err
    assert "output equals the single-process layer" in out
    from stepscope.results.store import read_records

    record = read_records(tmp_path / "moe-ep.jsonl")[0]
    metrics, config_out = record["metrics"], record["config"]
    assert config_out["ep"] == 2 and config_out["model_spec"]["capacity_factor"] == 1.0
    assert record["env"]["world_size"] == 2
    assert metrics["max_abs_error"] <= 1e-5
    assert metrics["dropped_assignments"] == dropped and metrics["dispatch_rows"] == kept
    for piece in ("router", "dispatch", "experts", "combine", "shared", "layer"):
        assert metrics[f"{piece}_ms_median"] > 0 and metrics[f"{piece}_n"] == 3
    # the busiest rank sent its kept rows (to itself included), fp32 of width 64; the load is the busiest expert's
    # kept assignments over the mean, both from the independent router
    assert metrics["dispatch_bytes"] == max(per_rank) * 64 * 4
    assert metrics["load_max_over_mean"] == pytest.approx(max(per_expert) / (sum(per_expert) / len(per_expert)))


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
