"""The rules a `ParallelPlan` must obey, in one table (`CONSTRAINTS`) used twice: `ParallelPlan.check` raises
on the first broken rule with a one-line explanation ("tp=3 does not divide n_heads=32"), and the planner
evaluates the same predicates on numpy arrays of candidates (they only use `%`, `//`, `==`, `>`, `&`, `|`,
which work on ints and on arrays alike) to count which rule excluded how many candidates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Facts:
    """The model and workload numbers the rules refer to."""

    n_heads: int
    n_kv_heads: int
    d_ff: int
    n_layers: int
    global_batch: int
    seq: int
    n_experts: int = 0
    expert_d_ff: int = 1

    @classmethod
    def of(cls, model: Any, global_batch: int, seq: int) -> Facts:
        return cls(model.n_heads, model.n_kv_heads, model.d_ff, model.n_layers, global_batch, seq,
                   getattr(model, "n_experts", 0), getattr(model, "expert_d_ff", None) or model.d_ff)


@dataclass(frozen=True)
class Constraint:
    """One rule: a predicate on (plan, facts) that also works element-wise on arrays, and its explanation."""

    name: str
    test: Callable[[Any, Facts], Any]
    message: Callable[[Any, Facts], str]


def _expert_ranks(p: Any) -> Any:
    """Ranks the EP group is carved out of: dp x cp, and the tp ranks too with whole experts (expert_tp 1)."""
    return p.dp * p.cp * (1 + (p.tp - 1) * (p.expert_tp == 1))


def _local_batch(p: Any, f: Facts) -> Any:
    return f.global_batch // p.dp


def _round_micro_batches(p: Any, f: Facts) -> Any:
    return _local_batch(p, f) // p.micro_batch // p.pipeline_rounds


def stage_layers(pp: Any, first: Any, last: Any, n_layers: int) -> tuple[Any, Any, Any]:
    """(first, middle, last) layers per stage from the plan's fields (0 = an even share); ints or arrays.
    The middle stages (pp - 2 of them) share what the first and last leave; pp = 2 has none (middle repeats
    the first), pp = 1 one stage of n_layers."""
    even = n_layers // pp
    first = first + (first == 0) * even
    last = last + (last == 0) * even
    inner = (pp - 2) * (pp > 2) + (pp <= 2)  # avoid dividing by zero where there is no middle stage
    middle = (n_layers - first - last) // inner
    middle = middle * (pp > 2) + first * (pp <= 2)
    single = pp == 1
    return (first * (1 - single) + n_layers * single, middle * (1 - single) + n_layers * single,
            last * (1 - single) + n_layers * single)


def _middle(p: Any, f: Facts) -> Any:
    return stage_layers(p.pp, p.first_stage_layers, p.last_stage_layers, f.n_layers)[1]


def _stages_valid(p: Any, f: Facts) -> Any:
    first, middle, last = stage_layers(p.pp, p.first_stage_layers, p.last_stage_layers, f.n_layers)
    even = (p.first_stage_layers == 0) & (p.last_stage_layers == 0)
    total = first + middle * (p.pp - 2) * (p.pp > 2) + last * (p.pp > 1)
    uneven_ok = (p.pp > 1) & (first >= 1) & (middle >= 1) & (last >= 1) & (total == f.n_layers)
    return (even & (f.n_layers % p.pp == 0)) | ((even == False) & uneven_ok)  # noqa: E712 - arrays too


def _stages_message(p: Any, f: Facts) -> str:
    if p.first_stage_layers == 0 and p.last_stage_layers == 0:
        return (f"pp={p.pp} does not divide n_layers={f.n_layers} (give --first-stage-layers / "
                f"--last-stage-layers for uneven stages)")
    if p.pp == 1:
        return "first/last stage layer counts need pipeline parallelism (pp > 1)"
    first, middle, last = stage_layers(p.pp, p.first_stage_layers, p.last_stage_layers, f.n_layers)
    return (f"stages of {first} (first), {last} (last) and {p.pp - 2} x the rest do not split n_layers="
            f"{f.n_layers} evenly into stages of at least one layer")


CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint("tp divides n_heads", lambda p, f: f.n_heads % p.tp == 0,
               lambda p, f: f"tp={p.tp} does not divide n_heads={f.n_heads}"),
    Constraint("tp divides n_kv_heads", lambda p, f: f.n_kv_heads % p.tp == 0,
               lambda p, f: f"tp={p.tp} does not divide n_kv_heads={f.n_kv_heads}"),
    Constraint("tp divides d_ff", lambda p, f: f.d_ff % p.tp == 0,
               lambda p, f: f"tp={p.tp} does not divide d_ff={f.d_ff}"),
    Constraint("pipeline stages hold every layer", _stages_valid,
               lambda p, f: _stages_message(p, f)),
    Constraint("interleave divides layers per stage", lambda p, f: _middle(p, f) % p.interleave == 0,
               lambda p, f: f"interleave={p.interleave} does not divide the {_middle(p, f)} layers "
                            f"per pipeline stage"),
    Constraint("interleave needs pp > 1", lambda p, f: (p.interleave == 1) | (p.pp > 1),
               lambda p, f: f"interleave={p.interleave} needs pipeline parallelism (pp > 1)"),
    Constraint("cp splits the sequence", lambda p, f: (p.cp == 1) | (f.seq % (2 * p.cp) == 0),
               lambda p, f: f"cp={p.cp} needs seq divisible by 2*cp={2 * p.cp} (load-balanced causal split), "
                            f"got seq={f.seq}"),
    Constraint("dp divides global batch", lambda p, f: f.global_batch % p.dp == 0,
               lambda p, f: f"dp={p.dp} does not divide the global batch {f.global_batch}"),
    Constraint("micro-batch divides local batch", lambda p, f: _local_batch(p, f) % p.micro_batch == 0,
               lambda p, f: f"micro_batch={p.micro_batch} does not divide the {_local_batch(p, f)} sequences "
                            f"per data-parallel replica"),
    Constraint("pipeline rounds divide the micro-batches",  # without a pipeline, rounds change nothing
               lambda p, f: (p.pp == 1) | ((_local_batch(p, f) // p.micro_batch) % p.pipeline_rounds == 0),
               lambda p, f: f"pipeline_rounds={p.pipeline_rounds} does not divide the "
                            f"{_local_batch(p, f) // p.micro_batch} micro-batches per step"),
    Constraint("interleave needs micro-batches divisible by pp",
               lambda p, f: (p.interleave == 1) | (_round_micro_batches(p, f) % p.pp == 0),
               lambda p, f: f"interleave={p.interleave} needs the {_round_micro_batches(p, f)} "
                            f"micro-batches{' of each pipeline round' if p.pipeline_rounds > 1 else ''} to be "
                            f"a multiple of pp={p.pp}"),
    Constraint("shard group divides dp x cp", lambda p, f: (p.shard_group == 0) | ((p.dp * p.cp) % (
        p.shard_group + (p.shard_group == 0)) == 0),
               lambda p, f: f"shard_group={p.shard_group} does not divide the dp x cp = {p.dp * p.cp} ranks holding "
                            f"the same weights"),
    Constraint("ep needs experts", lambda p, f: (p.ep == 1) | (f.n_experts > 0),
               lambda p, f: f"ep={p.ep} needs a Mixture-of-Experts model (n_experts > 0)"),
    Constraint("ep divides n_experts", lambda p, f: (f.n_experts == 0) | (f.n_experts % p.ep == 0),
               lambda p, f: f"ep={p.ep} does not divide n_experts={f.n_experts}"),
    Constraint("ep divides dp x cp", lambda p, f: (_expert_ranks(p)) % p.ep == 0,
               lambda p, f: f"ep={p.ep} does not divide the dp x cp{' x tp' if p.expert_tp == 1 else ''} = "
                            f"{_expert_ranks(p)} ranks it is carved out of"),
    Constraint("tp divides expert_d_ff",
               lambda p, f: (f.n_experts == 0) | (p.expert_tp == 1) | (f.expert_d_ff % p.tp == 0),
               lambda p, f: f"tp={p.tp} does not divide expert_d_ff={f.expert_d_ff}"),
    Constraint("MoE with tp > 1 needs sequence parallel",
               lambda p, f: (f.n_experts == 0) | (p.tp == 1) | (p.sequence_parallel == True),  # noqa: E712
               lambda p, f: "a Mixture-of-Experts model with tp > 1 needs sequence_parallel (as Megatron-Core "
                            "requires: each TP rank dispatches its own tokens)"),
    Constraint("ep > 1 shards over all dp x cp ranks", lambda p, f: (p.ep == 1) | (p.shard_group == 0),
               lambda p, f: f"ep={p.ep} is modelled with ZeRO/FSDP over all dp x cp ranks, not HSDP shard groups "
                            f"(got shard_group={p.shard_group})"),
    Constraint("sequence parallel needs tp > 1", lambda p, f: (p.sequence_parallel == False) | (p.tp > 1),  # noqa: E712
               lambda p, f: "sequence_parallel needs tensor parallelism (tp > 1)"),
    Constraint("sequence parallel splits the sequence",
               lambda p, f: (p.sequence_parallel == False) | ((f.seq // p.cp) % p.tp == 0),  # noqa: E712
               lambda p, f: f"sequence_parallel needs the {f.seq // p.cp} tokens per sequence and context-parallel "
                            f"rank to be divisible by tp={p.tp}"),
)
