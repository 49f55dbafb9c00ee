"""The plan search: only valid, feasible plans, ranked correctly, equal to a brute-force scalar search."""

import dataclasses
import itertools
import os
import sys

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel import evaluate
from stepscope.perfmodel.model.candidates import PLACEMENTS, canonical_placements
from stepscope.perfmodel.search import search as search_module
from stepscope.perfmodel.search.pool import map_chunks, pool_size
from stepscope.perfmodel.search.search import MEMORY_RULE, SearchSpace, search
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import DIMENSIONS, ParallelPlan
from stepscope.spec.system import load_system

SPEC = get_preset("small")
_CPU = load_system("CPU")
SYSTEM = _CPU.replace(accelerator=dataclasses.replace(_CPU.accelerator, hbm_GiB=9.0))  # some plans fit, some not
WORKLOAD = Workload(batch=32, seq=1024, precision="fp32", mode="train")
SPACE = SearchSpace(tp=(1, 2, 4), pp=(1, 2, 4), cp=(1, 2), micro_batch=(1, 8, 32), interleave=(1, 2), zero=(0, 3),
                    recompute=("none", "full"), sequence_parallel=(False, True), flash_attention=(True, False))


def brute_force(gpus: int) -> dict:
    """Every plan of SPACE on every one of the 24 placements, evaluated one by one with the reference."""
    distinct, seen = {}, set()
    for tp, pp, cp, mb, v, zero, rec, sp, flash, placement in itertools.product(
            SPACE.tp, SPACE.pp, SPACE.cp, SPACE.micro_batch, SPACE.interleave, SPACE.zero, SPACE.recompute,
            SPACE.sequence_parallel, SPACE.flash_attention, PLACEMENTS):
        if gpus % (tp * pp * cp):
            continue
        plan = ParallelPlan(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp, micro_batch=mb, interleave=v, zero=zero,
                            recompute=rec, sequence_parallel=sp, flash_attention=flash, placement=placement)
        try:
            plan.check(SPEC, WORKLOAD.batch, WORKLOAD.seq)
        except UsageError:
            continue
        # placements that give every group the same stride are the same placement: evaluated once
        key = (plan.replace(placement=DIMENSIONS), tuple(plan.stride(d) for d in DIMENSIONS if plan.size(d) > 1))
        if key in seen:
            continue
        seen.add(key)
        p = evaluate(SPEC, WORKLOAD, plan, SYSTEM)
        if p.memory.feasible:
            distinct[key] = p.tokens_per_s
    return distinct


def test_search_equals_brute_force_and_returns_only_feasible_valid_plans():
    result = search(SPEC, WORKLOAD, SYSTEM, 4, SPACE, top_k=5, workers=2)
    expected = brute_force(4)
    assert result.feasible == len(expected) > 0
    assert result.evaluated > result.feasible and result.rejected[MEMORY_RULE] == result.evaluated - result.feasible
    speeds = [m["tokens_per_s"] for _, m in result.top]
    assert speeds == sorted(speeds, reverse=True)
    assert speeds[0] == pytest.approx(max(expected.values()), rel=1e-9)
    for plan, metrics in result.top:
        plan.check(SPEC, WORKLOAD.batch, WORKLOAD.seq, gpus=4)
        p = evaluate(SPEC, WORKLOAD, plan, SYSTEM)
        assert p.memory.feasible and metrics["feasible"]
        assert metrics["tokens_per_s"] == pytest.approx(p.tokens_per_s, rel=1e-9)
        assert metrics["mem_GiB"] == pytest.approx(p.memory.total / 2**30, rel=1e-9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker processes are forked on Linux only")
def test_chunks_run_on_forked_workers_in_order():
    results = list(map_chunks(lambda chunk: (chunk, os.getpid()), range(8), 2))
    assert [chunk for chunk, _ in results] == list(range(8))
    workers = {pid for _, pid in results}
    assert os.getpid() not in workers and 1 <= len(workers) <= 2
    assert {pid for _, pid in map_chunks(lambda chunk: (chunk, os.getpid()), range(3), 1)} == {os.getpid()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="worker processes are forked on Linux only")
def test_worker_processes_find_what_one_process_finds(monkeypatch):
    # small chunks so that a search of 16 GPUs has many: the forked workers share them out
    monkeypatch.setattr(search_module, "CHUNK", 64)
    spec = get_preset("tiny-moe")
    workload = Workload(batch=32, seq=256, precision="fp32", mode="train")
    alone, pooled = (search(spec, workload, SYSTEM, 16, SearchSpace(), top_k=5, workers=w) for w in (1, 2))
    assert pooled.workers == 2 and alone.workers == 1
    assert (pooled.evaluated, pooled.feasible, pooled.rejected) == (alone.evaluated, alone.feasible, alone.rejected)
    assert [(p, m["tokens_per_s"], m["equivalent_plans"]) for p, m in pooled.top] == \
        [(p, m["tokens_per_s"], m["equivalent_plans"]) for p, m in alone.top]
    assert pool_size(8, 1) == 1 and pool_size(3, 10) == 3


def test_a_value_given_twice_is_searched_once():
    space = SearchSpace(tp=(2, 1, 2), zero=(1, 1), recompute=("none", "none", "full"))
    assert (space.tp, space.zero, space.recompute) == ((2, 1), (1,), ("none", "full"))
    once, twice = (search(SPEC, WORKLOAD, SYSTEM, 4, SearchSpace(zero=z), top_k=3) for z in ((1,), (1, 1)))
    assert twice.evaluated == once.evaluated
    assert [m["equivalent_plans"] for _, m in twice.top] == [m["equivalent_plans"] for _, m in once.top]


def test_canonical_placements_are_k_factorial():
    assert len(canonical_placements({"tp": 8, "cp": 1, "dp": 4, "pp": 2})) == 6
    assert len(canonical_placements({"tp": 1, "cp": 1, "dp": 1, "pp": 1})) == 1
    assert len(canonical_placements({"tp": 2, "cp": 2, "dp": 2, "pp": 2})) == 24


def test_no_feasible_plan_names_the_constraint():
    result = search(get_preset("megatron-1t"), Workload(batch=8, seq=2048, precision="bf16"),
                    load_system("A100-80GB"), 8, SearchSpace(interleave=(1, 3)))
    assert result.top == [] and result.evaluated > 0 and result.closest is not None
    message = result.why_none()
    assert "memory excluded all" in message and "GiB per GPU" in message and "\n" not in message
    assert "interleave=3 does not divide" in message


def test_rejection_counts_follow_the_rules():
    space = SearchSpace(tp=(1, 3), pp=(1,), micro_batch=(1,), interleave=(1,), zero=(0,), recompute=("none",),
                        sequence_parallel=(False,), placements=False, shard_group=(0,))
    result = search(get_preset("llama3-8b"), Workload(batch=8, seq=256, precision="bf16"), load_system("H100-SXM"),
                    3, space)
    assert result.rejected["tp divides n_heads"] == 1 and result.examples["tp divides n_heads"] == \
        "tp=3 does not divide n_heads=32"
    assert result.rejected["dp divides global batch"] == 1  # tp=1 leaves dp=3
    assert result.evaluated == 0 and "no valid plan" in result.why_none()


def test_each_candidate_is_rejected_once_and_examples_cite_what_no_earlier_rule_rejected():
    """Llama 3 8B at seq 4090 on 12 GPUs, tp 4 with sequence parallelism, cp 3 or 1 (cp 3 first): cp 3 breaks the
    CP rule (4090 is not a multiple of 6) and the sequence-parallel one (1363 tokens per CP rank, not a multiple
    of 4); cp 1 only the sequence-parallel one (4090 tokens). Each counts once, under the first rule it breaks:
    the sequence-parallel example is the cp 1 candidate, and the counts add up to the candidates enumerated."""
    space = SearchSpace(tp=(4,), pp=(1,), cp=(3, 1), micro_batch=(1,), interleave=(1,), zero=(0, 1),
                        recompute=("none",), sequence_parallel=(True,), placements=False, shard_group=(0,))
    result = search(get_preset("llama3-8b"), Workload(batch=12, seq=4090, precision="bf16"), load_system("H100-SXM"),
                    12, space)
    assert result.enumerated == 4 and result.evaluated == 0  # 2 shapes x 2 ZeRO stages
    assert result.rejected == {"cp splits the sequence": 2, "sequence parallel splits the sequence": 2}
    assert result.breaking == {"cp splits the sequence": 2, "sequence parallel splits the sequence": 4}
    assert result.examples["sequence parallel splits the sequence"] == (
        "sequence_parallel needs the 4090 tokens per sequence and context-parallel rank to be divisible by tp=4")


def test_rejections_and_evaluations_add_up_to_the_candidates_enumerated():
    result = search(SPEC, WORKLOAD, SYSTEM, 4, dataclasses.replace(SPACE, flash_attention=(True,)), top_k=1)
    rules = {rule: n for rule, n in result.rejected.items() if rule != MEMORY_RULE}
    assert sum(rules.values()) + result.evaluated == result.enumerated
    assert result.rejected[MEMORY_RULE] + result.feasible == result.evaluated
    assert all(result.breaking[rule] >= n for rule, n in rules.items())
    assert sum(result.breaking.values()) > sum(result.rejected.values())  # some candidates break several rules
    assert set(result.examples) == set(rules)  # the memory rule has one only when nothing fits



def test_top_k_is_k_distinct_answers_with_complete_tie_counts():
    # GPT-3 175B on 1,024 A100s: equal plans (placements that put the same groups on the same links, ZeRO
    # stages that cost the same) are many, more than a fixed multiple of k would keep
    spec, system = get_preset("gpt3-175b"), load_system("A100-80GB")
    workload = Workload(batch=1536, seq=2048, precision="bf16", mode="train")
    wide = search(spec, workload, system, 1024, top_k=40).top
    answers = [(m["tokens_per_s"], m["mem_GiB"], m["equivalent_plans"]) for _, m in wide]
    assert len(answers) == 40 and len({(speed, memory) for speed, memory, _ in answers}) == 40  # all distinct
    assert sum(e for *_, e in answers[:10]) > 3 * 10  # ties heavy enough to matter
    top = search(spec, workload, system, 1024, top_k=10).top
    assert [(m["tokens_per_s"], m["mem_GiB"], m["equivalent_plans"]) for _, m in top] == answers[:10]
