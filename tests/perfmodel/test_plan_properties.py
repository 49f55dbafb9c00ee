"""The performance model on asymmetric and extreme plans, against hand calculations: uneven pipelines with first !=
last stage counts on pp = 1, 2, 3, 4 (memory of the fullest stage and the pace stage by hand, and both swapped
when the first and last counts are), more sharding never raising memory, a plan evaluated alone equal to the same
plan inside a search, and each plan rule and the memory limit binding where a hand count says (Hypothesis over
random plans; a few dozen examples each, sized for 2 cores)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from stepscope.errors import UsageError
from stepscope.perfmodel.model import ops
from stepscope.perfmodel.model.evaluate import evaluate
from stepscope.perfmodel.model.layout import plan_geometry as geometry
from stepscope.perfmodel.model.step import CAUSES, PHASES
from stepscope.perfmodel.search.search import MEMORY_RULE, SearchSpace, search
from stepscope.spec import Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.system import load_system

SPEC = get_preset("llama3-8b", n_layers=24, vocab_size=1024)
"""Llama 3 8B's blocks, 24 of them, and a vocabulary of 1,024: the embedding and the head cost far less than a
block, so the stage holding the most blocks sets the pace (ties: the last, with the head, before the first, with
the embedding, before a middle one)."""
H100 = load_system("H100-SXM")
ROOMY = H100.replace(accelerator=dataclasses.replace(H100.accelerator, hbm_GiB=1e6))  # every plan fits
SEQ = 2048
SETTINGS = settings(max_examples=40, deadline=None)


def workload(plan: ParallelPlan, micro_batches: int = 8) -> Workload:
    return Workload(batch=plan.dp * plan.micro_batch * micro_batches, seq=SEQ, precision="bf16", mode="train")


def hand_stages(plan: ParallelPlan, micro_batches: int = 8) -> dict[str, float]:
    """Bytes per GPU of each pipeline stage, by hand (bf16 mixed precision, Adam; docs/model.md "Memory"):
    parameters x (2 weights + 2 gradients + 12 Adam and master weights), ZeRO stage z sharding them over the
    dp x cp ranks (1: Adam, 2: + gradients, 3: + weights; a pipeline keeps ZeRO-1's memory); a block's matrices
    split over tp, its two RMSNorms whole; the embedding (vocab x d / tp) on the first stage, the final norm and
    the untied vocabulary projection on the last; activations: the stage's blocks x the micro-batches its 1F1B
    rank holds (min(pp - r, m)) x one block's saved bytes, plus the logits on the last stage (bf16 logits, fp32
    log-probabilities and their copy: 10 bytes per token per vocabulary entry on this rank); ZeRO-3 holds two
    gathered blocks."""
    d, vocab, tp, pp = SPEC.d_model, SPEC.vocab_size, plan.tp, plan.pp
    block = 2 * d + (SPEC.attention_params() + SPEC.mlp_params()) / tp
    zero = plan.zero if pp == 1 else min(plan.zero, 1)
    shard = plan.dp * plan.cp
    per_param = (2 / shard if zero >= 3 else 2) + (2 / shard if zero >= 2 else 2) + (12 / shard if zero >= 1 else 12)
    ops_of_a_block = ops.layer_ops(SPEC, geometry(plan, workload(plan, micro_batches)))
    saved = float(np.sum([np.asarray(op.saved_bytes).reshape(-1)[0] for op in ops_of_a_block]))
    logits = plan.micro_batch * SEQ / plan.cp * vocab / tp * 10
    gathered = 2 * block * 2 if zero == 3 else 0.0
    embedding, head = vocab * d / tp, d + vocab * d / tp
    if pp == 1:
        return {"only": (SPEC.n_layers * block + embedding + head) * per_param + SPEC.n_layers * saved + logits
                + gathered}
    first, middle, last = plan.stage_layers(SPEC.n_layers)
    stages = {"first": (first * block + embedding) * per_param + first * min(pp, micro_batches) * saved,
              "last": (last * block + head) * per_param + last * saved + logits}
    if pp > 2:
        stages["middle"] = middle * block * per_param + middle * min(pp - 1, micro_batches) * saved
    return stages


def hand_pace(plan: ParallelPlan) -> str:
    """The stage with the most blocks; ties: last (head), then first (embedding), then middle."""
    if plan.pp == 1:
        return "only"
    first, middle, last = plan.stage_layers(SPEC.n_layers)
    layers = {"last": last, "first": first, **({"middle": middle} if plan.pp > 2 else {})}
    return max(layers, key=layers.get)  # dicts keep order: the first maximum in tie order wins


@st.composite
def pipelines(draw) -> ParallelPlan:
    """A valid plan with an uneven pipeline of 1 to 4 stages: the first and last counts drawn, the middle
    stages sharing the rest equally."""
    pp = draw(st.integers(1, 4))
    tp = draw(st.sampled_from([1, 2, 4]))
    plan = ParallelPlan(dp=draw(st.sampled_from([1, 2, 4])), tp=tp, pp=pp, cp=draw(st.sampled_from([1, 2])),
                        micro_batch=draw(st.sampled_from([1, 2])), zero=draw(st.integers(0, 3)),
                        sequence_parallel=tp > 1 and draw(st.booleans()))
    if pp == 1:
        return plan
    first = draw(st.integers(1, 20))
    if pp == 2:
        last = SPEC.n_layers - first
    else:
        middle = draw(st.integers(1, (SPEC.n_layers - first - 1) // (pp - 2) if SPEC.n_layers - first > pp - 2
                                  else 1))
        last = SPEC.n_layers - first - middle * (pp - 2)
    assume(last >= 1)
    return plan.replace(first_stage_layers=first, last_stage_layers=last)


def check_by_hand(plan: ParallelPlan) -> None:
    plan.check(SPEC, workload(plan).batch, SEQ)
    prediction = evaluate(SPEC, workload(plan), plan, H100)
    stages = hand_stages(plan)
    assert prediction.memory.total == pytest.approx(max(stages.values()), rel=1e-12), stages
    assert prediction.extras["pace_stage"] == hand_pace(plan)


@SETTINGS
@given(pipelines())
@example(ParallelPlan(pp=2, first_stage_layers=7, last_stage_layers=17))
@example(ParallelPlan(pp=3, first_stage_layers=5, last_stage_layers=9))
@example(ParallelPlan(pp=4, tp=2, dp=2, zero=1, first_stage_layers=2, last_stage_layers=14))
@example(ParallelPlan(pp=1, tp=2, dp=4, zero=3))
def test_property_fullest_stage_and_pace_by_hand_and_swapped(plan):
    """The memory of the fullest stage and the stage that sets the pace equal the hand calculation, and so do
    they with the first and last stage counts swapped (the rank holding the most micro-batches and the rank
    with the head trade places)."""
    check_by_hand(plan)
    if plan.pp > 1:
        check_by_hand(plan.replace(first_stage_layers=plan.last_stage_layers,
                                   last_stage_layers=plan.first_stage_layers))


def test_swapping_the_first_and_last_counts_moves_both_bottlenecks():
    """pp 4, stages 2/8/8/14: the last sets the pace and is the fullest (14 blocks' weights). Swapped, 14/8/8/2:
    the first does both, and needs more (its rank holds 4 micro-batches of 14 blocks, the last rank 1)."""
    plan = ParallelPlan(pp=4, first_stage_layers=2, last_stage_layers=14)
    swapped = plan.replace(first_stage_layers=14, last_stage_layers=2)
    before, after = (evaluate(SPEC, workload(p), p, H100) for p in (plan, swapped))
    assert (before.extras["pace_stage"], after.extras["pace_stage"]) == ("last", "first")
    stages, stages_swapped = hand_stages(plan), hand_stages(swapped)
    assert max(stages, key=stages.get) == "last" and max(stages_swapped, key=stages_swapped.get) == "first"
    assert before.memory.total == pytest.approx(stages["last"], rel=1e-12)
    assert after.memory.total == pytest.approx(stages_swapped["first"], rel=1e-12)
    assert after.memory.total > before.memory.total


def test_swapping_moves_the_fullest_stage_from_the_middle_to_the_first():
    """dp 8, ZeRO-1, micro-batches of 4, stages 4/7/7/6: a middle rank is the fullest (3 micro-batches of 7 blocks)
    and sets the pace (7 blocks). Swapped, 6/7/7/4: the first rank's 4 micro-batches of 6 blocks need more than
    3 of 7 (activations of a block weigh more than a third of its sharded weights and state), while the pace stays
    in the middle."""
    plan = ParallelPlan(pp=4, dp=8, zero=1, micro_batch=4, first_stage_layers=4, last_stage_layers=6)
    swapped = plan.replace(first_stage_layers=6, last_stage_layers=4)
    for p, fullest in ((plan, "middle"), (swapped, "first")):
        stages = hand_stages(p, micro_batches=8)
        assert max(stages, key=stages.get) == fullest
        prediction = evaluate(SPEC, workload(p), p, H100)
        assert prediction.memory.total == pytest.approx(stages[fullest], rel=1e-12)
        assert prediction.extras["pace_stage"] == "middle"


@SETTINGS
@given(pipelines(), st.sampled_from(["tp", "zero", "pp", "shard"]))
def test_property_more_sharding_never_raises_memory(plan, how):
    """Doubling tp, raising the ZeRO stage (0 -> 1 -> 2 without a pipeline, where a pipeline keeps ZeRO-1's
    memory), doubling pp (even stages, ZeRO 0/1: ZeRO-2/3 under a pipeline hold ZeRO-1's memory, so from pp 1
    they can need more, asserted below) or sharding ZeRO/FSDP over all dp x cp ranks instead of groups of 2:
    never more memory per GPU."""
    plan = plan.replace(first_stage_layers=0, last_stage_layers=0, pp=1 if plan.pp == 3 else plan.pp)
    if how == "tp":
        assume(plan.tp <= 4)
        more = plan.replace(tp=2 * plan.tp, sequence_parallel=plan.sequence_parallel)
    elif how == "zero":
        assume(plan.zero < 2)
        more = plan.replace(zero=plan.zero + 1)
    elif how == "pp":
        plan = plan.replace(zero=min(plan.zero, 1))
        more = plan.replace(pp=2 * plan.pp)
    else:
        assume(plan.zero >= 1 and plan.dp * plan.cp > 2)
        plan, more = plan.replace(shard_group=2), plan.replace(shard_group=0)
    for p in (plan, more):
        p.check(SPEC, workload(plan).batch, SEQ)
    less_sharded, more_sharded = (evaluate(SPEC, workload(plan), p, H100).memory.total for p in (plan, more))
    assert more_sharded <= less_sharded


def test_zero3_under_a_pipeline_holds_zero1_memory_and_can_need_more_than_without():
    """dp 8, 24 blocks, ZeRO-3: without a pipeline all 16 bytes per parameter are sharded (2 per parameter and
    two gathered blocks); with pp 2 the pipeline keeps weights and gradients whole (4 + 12/8 bytes per
    parameter) on half the blocks: more memory, by hand."""
    flat = ParallelPlan(dp=8, zero=3)
    piped = flat.replace(pp=2)
    for plan in (flat, piped):
        assert evaluate(SPEC, workload(plan), plan, H100).memory.total == pytest.approx(
            max(hand_stages(plan).values()), rel=1e-12)
    assert max(hand_stages(piped).values()) > max(hand_stages(flat).values())
    assert evaluate(SPEC, workload(piped), piped, H100).memory.total == evaluate(
        SPEC, workload(piped), piped.replace(zero=1), H100).memory.total


def outputs(metrics: dict) -> dict:
    names = ["step_s", "tokens_per_s", "mfu_pct", "hfu_pct", "mem_GiB", "weights_GiB", "grads_GiB", "optimizer_GiB",
             "activations_GiB", *(f"{p}_ms" for p in PHASES), *(f"{c}_s" for c in CAUSES)]
    return {name: metrics[name] for name in names}


@settings(max_examples=30, deadline=None)
@given(pipelines(), st.booleans())
def test_property_a_plan_alone_equals_the_same_plan_inside_a_search(drawn, roomy):
    """The search of the drawn shape with every ZeRO stage and recompute mode (the evaluator's member grid, its
    terms broadcast over the group): every plan it reports, and the closest one when none fits, predicted alone
    gives exactly the same time, memory and breakdown (==, not approximately)."""
    system = ROOMY if roomy else H100
    plan = drawn.replace(first_stage_layers=0, last_stage_layers=0)
    assume(SPEC.n_layers % plan.pp == 0)
    space = SearchSpace(tp=(plan.tp,), pp=(plan.pp,), cp=(plan.cp,), micro_batch=(plan.micro_batch,),
                        interleave=(1,), sequence_parallel=(plan.sequence_parallel,), shard_group=(0,),
                        placements=False, uneven_stages=True)
    result = search(SPEC, workload(plan), system, plan.gpus, space, top_k=12)
    reported = result.top or [result.closest]
    assert reported and reported[0] is not None
    for found, metrics in reported:
        alone = evaluate(SPEC, workload(plan), found, system).metrics()
        assert outputs(alone) == outputs(metrics), found.describe()


def test_pipelines_of_one_two_and_three_stages_by_hand():
    """pp 1 takes no stage counts; pp 2 has no middle stage (7 + 17); pp 3 one middle stage of what is left
    (5 + 10 + 9): each stage's blocks, and the memory and pace by hand."""
    with pytest.raises(UsageError, match="need pipeline parallelism"):
        ParallelPlan(first_stage_layers=4, last_stage_layers=20).check(SPEC, 8, SEQ)
    assert ParallelPlan(pp=2, first_stage_layers=7, last_stage_layers=17).stage_layers(24) == (7, 7, 17)
    assert ParallelPlan(pp=3, first_stage_layers=5, last_stage_layers=9).stage_layers(24) == (5, 10, 9)
    with pytest.raises(UsageError, match="do not split n_layers=24"):
        ParallelPlan(pp=2, first_stage_layers=7, last_stage_layers=16).check(SPEC, 8, SEQ)
    for plan, pace in ((ParallelPlan(), "only"), (ParallelPlan(pp=2, first_stage_layers=7, last_stage_layers=17),
                                                 "last"),
                       (ParallelPlan(pp=3, first_stage_layers=5, last_stage_layers=9), "middle")):
        check_by_hand(plan)
        assert hand_pace(plan) == pace


def small_space(**values) -> SearchSpace:
    base = dict(tp=(1,), pp=(1,), cp=(1,), micro_batch=(1,), interleave=(1,), zero=(1,), recompute=("none",),
                sequence_parallel=(False,), placements=False, shard_group=(0,), uneven_stages=False)
    return SearchSpace(**{**base, **values})


@pytest.mark.parametrize("values, gpus, batch, seq, rule, count", [
    # tp 3 does not divide 32 heads: 1 shape x 2 ZeRO stages
    ({"tp": (1, 3), "zero": (0, 1)}, 3, 6, SEQ, "tp divides n_heads", 2),
    # pp 5 does not divide 24 blocks (and no uneven layout is tried)
    ({"pp": (1, 5)}, 5, 5, SEQ, "pipeline stages hold every layer", 1),
    # interleave 5 does not divide the 12 blocks of a stage of pp 2 (interleave 3 does)
    ({"pp": (2,), "interleave": (1, 3, 5)}, 2, 12, SEQ, "interleave divides layers per stage", 1),
    # interleave 2 needs the micro-batches (3) to be a multiple of pp (2)
    ({"pp": (2,), "interleave": (1, 2)}, 2, 3, SEQ, "interleave needs micro-batches divisible by pp", 1),
    # cp 3 needs seq divisible by 6: 2048 is not; cp 2 (4) is fine
    ({"cp": (1, 2, 3)}, 6, 6, SEQ, "cp splits the sequence", 1),
    # dp 4 does not divide a global batch of 6 (tp 1); tp 2 leaves dp 2, which does
    ({"tp": (1, 2)}, 4, 6, SEQ, "dp divides global batch", 1),
])
def test_each_rule_binds_where_a_hand_count_says(values, gpus, batch, seq, rule, count):
    result = search(SPEC, Workload(batch=batch, seq=seq, precision="bf16"), ROOMY, gpus, small_space(**values))
    assert result.rejected.get(rule) == count, result.rejected
    assert sum(n for r, n in result.rejected.items() if r != MEMORY_RULE) == count  # no other rule rejects
    assert result.evaluated == result.enumerated - count == result.feasible


def test_memory_binds_at_the_hand_computed_bytes():
    """A device with room for exactly the hand-computed bytes of the ZeRO-1 plan on dp 4 (plus or minus one
    byte): the plan fits with one more byte and is rejected by memory with one fewer; ZeRO-0 needs more and never
    fits."""
    plan = ParallelPlan(dp=4, zero=1)
    need = max(hand_stages(plan).values())
    for spare, fits in ((1, True), (-1, False)):
        gib = (need + spare) / 2**30 + H100.accelerator.reserved_GiB
        system = H100.replace(accelerator=dataclasses.replace(H100.accelerator, hbm_GiB=gib))
        result = search(SPEC, workload(plan), system, 4, small_space(zero=(0, 1)))
        assert result.enumerated == result.evaluated == 2
        assert result.feasible == int(fits) and result.rejected[MEMORY_RULE] == 2 - int(fits)
        if fits:
            assert result.top[0][0].zero == 1



@pytest.mark.parametrize("preset", ["gpt2", "llama3-8b"])
def test_without_a_pipeline_every_parameter_is_held_once(preset):
    """pp 1, tp 1, no ZeRO: the GPU holds the model's exact parameter count, a tied vocabulary projection once
    (GPT-2: 124,439,808 = 50,257 x 768 tokens + 1,024 x 768 positions + 12 blocks + the final norm); only a
    pipeline's last stage holds a second copy of it."""
    spec = get_preset(preset)
    workload = Workload(batch=1, seq=512, precision="fp32", mode="train")
    memory = evaluate(spec, workload, ParallelPlan(), load_system("H100-SXM")).memory
    assert memory.weights == spec.param_count() * 4
    if preset == "gpt2":
        assert spec.param_count() == 124_439_808
