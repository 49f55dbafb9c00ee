"""A plan evaluated alone equals the same plan evaluated among others (mixed attention kinds, groups of ZeRO
stages x recompute modes in any order, as a search passes them): one formula set, relative 1e-9."""

import random

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.model.candidates import PLACEMENTS, Candidates
from stepscope.perfmodel.model.evaluate import evaluate, evaluate_many
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import RECOMPUTE, ParallelPlan
from stepscope.spec.system import load_system

CASES = [  # (model, system, seq, global batch, precision, mode)
    ("gpt3-175b", "A100-80GB", 2048, 512, "bf16", "train"),
    ("llama3-70b", "H100-SXM", 8192, 256, "bf16", "train"),
    ("megatron-1.7b", "MI300X", 2048, 64, "fp16", "fwd-bwd"),
    ("small", "CPU", 256, 16, "fp32", "train"),
    ("gpt2", "B200", 1024, 32, "fp32", "fwd"),
    ("llama3-405b", "H100-SXM", 8192, 256, "fp8", "train"),
    ("gpt3-175b", "H200", 2048, 512, "fp8", "fwd-bwd"),
    # Mixture-of-Experts: expert parallelism, leading dense blocks, shared experts, head_dim != d_model / n_heads
    ("mixtral-8x7b", "H100-SXM", 4096, 256, "bf16", "train"),
    ("deepseek-v3-gqa", "H100-SXM", 4096, 512, "fp8", "train"),
    ("qwen3-30b-a3b", "H200", 4096, 128, "bf16", "fwd-bwd"),
    ("tiny-moe", "CPU", 128, 16, "fp32", "fwd"),
]


def random_plan(rng: random.Random, spec, batch: int, seq: int, switches: dict) -> ParallelPlan | None:
    """A random plan, or None when it breaks a rule (the caller draws again)."""
    powers = [1, 2, 4, 8, 16]
    tp, pp, cp, dp = (rng.choice(powers) for _ in range(4))
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    # uneven stages: first and last one layer fewer than the middle, or only the first given
    stages = rng.choice([(0, 0), (0, 0), "fewer", "first"])
    if stages == "fewer" and pp > 2 and (spec.n_layers + 2) % pp == 0:
        stages = ((spec.n_layers + 2) // pp - 1,) * 2
    elif stages == "first" and pp > 1 and spec.n_layers % pp == 0 and spec.n_layers // pp > 1:
        stages = (spec.n_layers // pp - 1, spec.n_layers // pp + 1)
    else:
        stages = (0, 0)
    shard = rng.choice([0, 0, 1, 2, 4])
    ep = rng.choice([1, 2, 4, 8]) if spec.is_moe else 1
    plan = ParallelPlan(ep=ep, dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=rng.choice(divisors),
                        interleave=rng.choice([1, 1, 2, 3, 4]), zero=rng.randrange(4),
                        recompute=rng.choice(RECOMPUTE),
                        sequence_parallel=tp > 1 and (spec.is_moe or rng.random() < 0.5),
                        flash_attention=rng.random() < 0.5, placement=rng.choice(PLACEMENTS),
                        first_stage_layers=stages[0], last_stage_layers=stages[1], shard_group=shard, **switches)
    try:
        return plan.check(spec, batch, seq)
    except UsageError:
        return None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vectorized_equals_scalar_on_random_plans(case):
    name, system_name, seq, batch, precision, mode = case
    spec, system = get_preset(name), load_system(system_name)
    workload = Workload(batch=batch, seq=seq, precision=precision, mode=mode)
    rng = random.Random(CASES.index(case))  # not hash(): string hashes change from run to run
    for switches in ({"dropout": True, "fp32_grads": True, "dp_overlap": False, "tp_overlap": False,
                      "reshard_after_forward": False, "fp8_recipe": "current"},
                     {"dropout": False, "fp32_grads": False, "dp_overlap": True, "tp_overlap": True},
                     {"dropout": True, "fp32_grads": False, "dp_overlap": True, "tp_overlap": True,
                      "reshard_after_forward": False, "fp8_recipe": "blockwise", "expert_imbalance": 1.3,
                      "ep_overlap": True, "dispatcher": "deepep", "expert_tp": 1, "pipeline_rounds": 2}):
        plans = []
        while len(plans) < (20 if spec.is_moe else 40):  # a MoE reference evaluation costs more
            plan = random_plan(rng, spec, batch, seq, switches)
            if plan is not None:
                plans.append(plan)
        mixed = evaluate_many(spec, workload, system, Candidates.from_plans(plans))
        # chunks with one attention kind take a shorter path: check it against the reference too
        fused = [p for p in plans if p.flash_attention]
        unfused = [p for p in plans if not p.flash_attention]
        separate = [(evaluate_many(spec, workload, system, Candidates.from_plans(group)), group)
                    for group in (fused, unfused) if group]
        for arrays, group in [(mixed, plans)] + separate:
            check(spec, workload, system, arrays, group)


def check(spec, workload, system, arrays, plans):
    """Every output of `evaluate_many` equals the reference `evaluate`, plan by plan."""
    for i, plan in enumerate(plans):
        ref = evaluate(spec, workload, plan, system)
        expected = {"step_s": ref.step_s, "mfu_pct": ref.mfu_pct, "hfu_pct": ref.hfu_pct,
                    "tokens_per_s": ref.tokens_per_s, "mem_GiB": ref.memory.total / 2**30,
                    **{f"{k}_ms": 1e3 * v for k, v in ref.phases.items()},
                    **{f"{k}_s": v for k, v in ref.breakdown.items()},
                    **{k: v for k, v in ref.memory.GiB().items()}}
        for key, value in expected.items():
            assert arrays[key][i] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, plan.describe())
        assert bool(arrays["feasible"][i]) == ref.memory.feasible


GROUP_ORDERS = {  # members of a group: the ZeRO stage x recompute mode grid a search makes, or any other order
    "grid": [(z, r) for z in range(4) for r in RECOMPUTE],
    "recompute-slowest": [(z, r) for r in RECOMPUTE for z in range(4)],
    "shuffled": random.Random(5).sample([(z, r) for z in range(4) for r in RECOMPUTE], 12),
}


@pytest.mark.parametrize("model", ["llama3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("order", list(GROUP_ORDERS))
def test_grouped_evaluation_equals_the_reference(model, order):
    """A search passes runs of plans that differ only in ZeRO stage and recompute mode (group_size): a
    stage x mode grid is evaluated on a (group, stage, mode) broadcast, other orders member by member."""
    spec, system = get_preset(model), load_system("H100-SXM")
    workload = Workload(batch=64, seq=4096, precision="bf16", mode="train")
    rng = random.Random(3)
    plans = []
    while len(plans) < 12 * 15:
        base = random_plan(rng, spec, 64, 4096, {"dropout": False, "fp32_grads": False, "dp_overlap": True,
                                                  "tp_overlap": False})
        if base is not None:
            plans += [base.replace(zero=z, recompute=r) for z, r in GROUP_ORDERS[order]]
    arrays = evaluate_many(spec, workload, system, Candidates.from_plans(plans), group_size=12)
    check(spec, workload, system, arrays, plans)
    with pytest.raises(ValueError, match="groups of 7"):
        evaluate_many(spec, workload, system, Candidates.from_plans(plans), group_size=7)
