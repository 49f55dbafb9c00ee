"""SystemSpec presets and TOML round trip; ParallelPlan rules and their one-line explanations."""

import math

import numpy as np
import pytest

from stepscope.errors import UsageError
from stepscope.spec import get_preset
from stepscope.spec.plan import CONSTRAINTS, Facts, ParallelPlan
from stepscope.spec.system import list_systems, load_system, parse_system_toml, system_to_toml

PRESETS = ["A100-80GB", "H100-SXM", "H100-SXM-500W", "H100-SXM-96GB-500W", "H800", "H200", "B200", "MI300X", "CPU"]


def test_every_preset_loads_and_round_trips_through_toml():
    assert sorted(PRESETS) == list_systems()
    for name in PRESETS:
        system = load_system(name)
        again = parse_system_toml(system_to_toml(system, header="a comment\nover two lines"), "round trip")
        assert again == system


def test_preset_numbers_are_the_published_unidirectional_ones():
    a100 = load_system("a100-80gb")  # names are case-insensitive
    assert a100.accelerator.matrix_peak("bf16") == 312e12
    assert a100.network.intra.GBps == 300  # NVLink3: 600 GB/s is the bidirectional figure
    assert a100.network.inter.GBps == 25 and a100.network.domain_size == 8
    h100 = load_system("H100-SXM")
    assert (h100.accelerator.hbm_GBps, h100.network.intra.GBps, h100.network.inter.GBps) == (3350, 450, 50)
    assert load_system("H200").accelerator.hbm_GiB == 141


def test_efficiency_is_interpolated_harmonically_in_log_size_and_clamped():
    acc = load_system("A100-80GB").accelerator
    knots = acc.matrix_efficiency_by_GFLOP
    for gflop, eff in knots:
        assert acc.efficiency(gflop * 1e9) == pytest.approx(eff)
    (g0, e0), (g1, e1) = knots[2], knots[3]
    middle = math.sqrt(g0 * g1) * 1e9  # halfway in log10
    assert acc.efficiency(middle) == pytest.approx(1 / (0.5 / e0 + 0.5 / e1))
    assert acc.efficiency(1.0) == knots[0][1] and acc.efficiency(1e18) == knots[-1][1]


def test_system_file_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="unknown system 'H900'"):
        load_system("H900")
    with pytest.raises(UsageError, match="no such system file"):
        load_system(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed\n")
    with pytest.raises(UsageError, match="malformed TOML") as error:
        load_system(bad)
    assert "\n" not in str(error.value)
    text = system_to_toml(load_system("CPU"))
    for broken, message in [(text.replace("hbm_GBps = 20.0", "hbm_GBps = -1.0"), "hbm_GBps must be positive"),
                            (text.replace("[network]", "[network]\nspeed = 3"), "unknown key 'speed'"),
                            (text.replace("fp32 = 0.18", "fp64x = 0.18"), "unknown precision 'fp64x'"),
                            (text.replace("domain_size = 8\n", ""), "missing key 'domain_size'"),
                            (text.replace("[[0.001, 0.3], [0.01", "[[0.01, 0.3], [0.001"), "must increase"),
                            (text.replace("fp8_efficiency = 1.0", "fp8_efficiency = 1.2"),
                             "fp8_efficiency must be at most 1.0")]:
        path = tmp_path / "edited.toml"
        path.write_text(broken)
        with pytest.raises(UsageError, match=message):
            load_system(path)
    path = tmp_path / "mine.toml"
    path.write_text(text.replace('name = "CPU"', 'name = "mine"'))
    assert load_system(path).name == "mine"


@pytest.mark.parametrize("plan, batch, seq, message", [
    (dict(tp=3), 8, 128, "tp=3 does not divide n_heads=32"),
    (dict(tp=16), 8, 128, "tp=16 does not divide n_kv_heads=8"),
    (dict(pp=5), 8, 128, "pp=5 does not divide n_layers=32"),
    (dict(pp=2, interleave=3), 8, 128, "interleave=3 does not divide the 16 layers per pipeline stage"),
    (dict(interleave=2), 8, 128, "needs pipeline parallelism"),
    (dict(cp=3), 8, 128, r"cp=3 needs seq divisible by 2\*cp=6"),
    (dict(dp=3), 8, 128, "dp=3 does not divide the global batch 8"),
    (dict(dp=2, micro_batch=3), 8, 128, "micro_batch=3 does not divide the 4 sequences"),
    (dict(pp=4, interleave=2, micro_batch=1), 6, 128, "needs the 6 micro-batches to be a multiple of pp=4"),
    (dict(sequence_parallel=True), 8, 128, "sequence_parallel needs tensor parallelism"),
    (dict(tp=8, cp=2, sequence_parallel=True), 8, 100, "the 50 tokens per sequence and context-parallel rank to "
                                                       "be divisible by tp=8"),
])
def test_invalid_plans_explain_themselves_in_one_line(plan, batch, seq, message):
    with pytest.raises(UsageError, match=message) as error:
        ParallelPlan(**plan).check(get_preset("llama3-8b"), batch, seq)
    assert "\n" not in str(error.value)


def test_plan_fields_gpus_and_strides():
    with pytest.raises(UsageError, match="zero must be"):
        ParallelPlan(zero=4)
    with pytest.raises(UsageError, match="recompute must be"):
        ParallelPlan(recompute="some")
    with pytest.raises(UsageError, match="placement must order"):
        ParallelPlan(placement=("tp", "dp"))
    with pytest.raises(UsageError, match="= 16 but 32 GPUs"):
        ParallelPlan(dp=2, tp=8).check(get_preset("llama3-8b"), 8, 128, gpus=32)
    plan = ParallelPlan(dp=4, tp=8, pp=2, placement=("tp", "dp", "cp", "pp"))
    assert plan.gpus == 64 and plan.micro_batches(64) == 16
    assert (plan.stride("tp"), plan.stride("dp"), plan.stride("pp")) == (1, 8, 32)


@pytest.mark.parametrize("model", ["gpt3-175b", "mixtral-8x7b"])
def test_rules_work_element_wise_on_arrays_like_on_one_plan(model):
    spec = get_preset(model)
    facts = Facts.of(spec, 1536, 2048)
    rng = np.random.default_rng(0)
    n = 300
    arrays = {"tp": rng.choice([1, 2, 3, 4, 8, 64], n), "pp": rng.choice([1, 2, 5, 8], n),
              "cp": rng.choice([1, 2, 3], n), "dp": rng.choice([1, 2, 3, 5, 8], n),
              "micro_batch": rng.choice([1, 2, 4, 7], n), "interleave": rng.choice([1, 2, 5], n),
              "sequence_parallel": rng.random(n) < 0.5,
              # uneven stages (0: even) and shard groups, valid and not
              "first_stage_layers": rng.choice([0, 0, 1, 11, 12], n), "last_stage_layers": rng.choice([0, 0, 1, 12], n),
              "shard_group": rng.choice([0, 0, 1, 2, 4], n), "ep": rng.choice([1, 1, 2, 3, 4, 8], n),
              "expert_tp": rng.choice([0, 1], n), "pipeline_rounds": rng.choice([1, 1, 2, 3, 4], n)}

    class Rows:
        pass

    rows = Rows()
    rows.__dict__.update(arrays)
    for rule in CONSTRAINTS:
        vector = np.asarray(rule.test(rows, facts), dtype=bool)
        for i in range(n):
            plan = ParallelPlan(**{k: (bool(v[i]) if k == "sequence_parallel" else int(v[i]))
                                   for k, v in arrays.items()})
            assert bool(rule.test(plan, facts)) == vector[i], rule.name
