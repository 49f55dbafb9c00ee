"""Search every valid parallel plan for a model, a system, N GPUs and a global batch.

1. Shapes: every (tp, pp, cp) whose product divides N, dp = N / (tp·pp·cp); crossed with every
   micro-batch and interleave value and, for a Mixture-of-Experts model, every expert-parallel size. The plan
   rules (`spec.plan.CONSTRAINTS`) are evaluated on these
   arrays in the table's order; for `--explain` each candidate is counted under the first rule it breaks (so the
   counts and the evaluated candidates add up to the enumerated ones, and each rule's example is a candidate no
   earlier rule rejected), and each rule's count of all the candidates breaking it is kept beside.
2. The surviving shapes (sequence parallelism included) are expanded into groups — one per distinct
   placement of the tp/cp/dp/pp groups on rank numbers and per attention kind — and each group into its
   members, one per (ZeRO stage, recompute mode).
3. Chunks of candidates are evaluated by `vectorized.evaluate_many` on worker processes (`search_pool`; group
   terms once per group); the feasible ones (memory fits) compete for the top k by tokens/s. Every candidate counted as
   evaluated gets its own step time, memory and verdict.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stepscope.errors import UsageError
from stepscope.perfmodel.model.candidates import PLACEMENTS, Candidates, canonical_placements, members_per_domain
from stepscope.perfmodel.model.evaluate import evaluate_many
from stepscope.perfmodel.search.pool import map_chunks, pool_size
from stepscope.perfmodel.search.top import merge_answers, scalar, top_answers
from stepscope.spec import ModelSpec, Workload
from stepscope.spec.plan import CONSTRAINTS, DIMENSIONS, RECOMPUTE, Facts, ParallelPlan
from stepscope.spec.stack import DEFAULT_STACK
from stepscope.spec.system import SystemSpec

# Candidates per evaluation chunk: large enough that the Python between array operations is amortized, small
# enough for the temporaries (512 KiB) to stay in cache; `keep_freed_memory` keeps them off fresh mmaps.
CHUNK = 1 << 16
MEMORY_RULE = "memory fits the device"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """Values each plan dimension may take; None means every value that can be valid."""

    tp: tuple[int, ...] | None = None
    """Tensor-parallel sizes (default: divisors of the GPU count)."""
    pp: tuple[int, ...] | None = None
    """Pipeline sizes (default: divisors of the GPU count)."""
    cp: tuple[int, ...] | None = None
    """Context-parallel sizes (default: divisors of the GPU count)."""
    micro_batch: tuple[int, ...] | None = None
    """Micro-batch sizes (default: divisors of the global batch)."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel sizes (default: the powers of two up to n_experts that divide dp x cp; 1 for a dense
    model)."""
    interleave: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    """Virtual pipeline chunks per stage."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages."""
    recompute: tuple[str, ...] = RECOMPUTE
    """Recompute modes."""
    sequence_parallel: tuple[bool, ...] = (False, True)
    """Sequence parallelism off/on (on only where tp > 1)."""
    flash_attention: tuple[bool, ...] = (True,)
    """Fused attention kernel or not."""
    uneven_stages: bool = True
    """Also try pipelines whose first and last stage hold one layer fewer than the others (Llama 3's
    balancing of the embedding and the loss), wherever that splits the layers, and, where pp does not divide
    the layers, middle stages of ceil(layers/pp) with the rest on the first and the last (DeepSeek-V3)."""
    shard_group: tuple[int, ...] = (0, 8)
    """ZeRO/FSDP shard group sizes (0: all dp x cp ranks; 8: one node, HSDP across nodes)."""
    reshard_after_forward: bool = True
    """ZeRO-3/FSDP gathers the weights again for backward."""
    fp8_recipe: str = "delayed"
    """Scaling of fp8 GEMMs when the workload's precision is fp8."""
    placements: bool = True
    """Search every distinct nesting of the groups on rank numbers (else tp, cp, dp, pp only)."""
    dropout: bool = False
    """The run applies dropout."""
    fp32_grads: bool = False
    """Gradients in fp32."""
    dp_overlap: bool = True
    """Gradient reduction overlaps backward."""
    tp_overlap: bool = False
    """TP/CP collectives overlap their GEMMs."""
    expert_imbalance: float = 1.0
    """Tokens of the busiest expert-parallel rank / the mean (`ParallelPlan.expert_imbalance`)."""
    ep_overlap: bool = False
    """All-to-alls hide behind the MoE blocks' GEMMs (`ParallelPlan.ep_overlap`)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (`ParallelPlan.dispatcher`)."""
    expert_tp: int = 0
    """Whole experts with EP folded over the TP ranks (1) or experts split over tp (0) (`ParallelPlan.expert_tp`)."""
    pipeline_rounds: int = 1
    """Pipeline schedules per step, the same for every plan (`ParallelPlan.pipeline_rounds`)."""
    stack: str = DEFAULT_STACK
    """The training software every plan runs on (`ParallelPlan.stack`)."""

    def __post_init__(self) -> None:
        # a value given twice is one value: kept twice, every plan with it would be counted (and tied) twice
        for name, value in vars(self).items():
            if isinstance(value, tuple):
                object.__setattr__(self, name, tuple(dict.fromkeys(value)))
        # the plan's rules for the values every plan shares
        ParallelPlan(expert_imbalance=self.expert_imbalance, pipeline_rounds=self.pipeline_rounds, stack=self.stack)


@dataclass
class SearchResult:
    """The best feasible plans and the accounting of everything that was looked at."""

    top: list[tuple[ParallelPlan, dict[str, float]]]
    evaluated: int
    """Candidates evaluated by the model (valid under every rule)."""
    feasible: int
    rejected: dict[str, int]
    """Rule name -> candidates whose first broken rule (in `CONSTRAINTS` order) it is; the memory rule: evaluated
    candidates that do not fit. These counts and `feasible` add up to `enumerated`."""
    examples: dict[str, str]
    """Rule name -> the explanation for one candidate it rejected first (no earlier rule rejected it)."""
    enumerate_s: float
    evaluate_s: float
    closest: tuple[ParallelPlan, dict[str, float]] | None = None
    """With no feasible plan: the candidate needing the least memory."""
    notes: list[str] = field(default_factory=list)
    workers: int = 1
    """Processes that evaluated the chunks."""
    enumerated: int = 0
    """Candidates of the search space: the rules' first rejections plus the evaluated ones."""
    breaking: dict[str, int] = field(default_factory=dict)
    """Rule name -> every enumerated candidate that breaks it, whatever else it breaks (they overlap)."""

    @property
    def seconds(self) -> float:
        return self.enumerate_s + self.evaluate_s

    @property
    def configs_per_s(self) -> float:
        return self.evaluated / self.seconds if self.seconds > 0 else float("inf")

    def why_none(self) -> str:
        """One line: which constraint left no feasible plan."""
        rules = {rule: n for rule, n in self.rejected.items() if rule != MEMORY_RULE}
        worst = max(rules.items(), key=lambda kv: kv[1]) if rules else None
        others = f"'{worst[0]}' excluded the most other candidates ({worst[1]:,}): {self.examples[worst[0]]}" \
            if worst else ""
        if self.evaluated:
            return (f"no feasible plan: memory excluded all {self.evaluated:,} valid candidates "
                    f"({self.examples.get(MEMORY_RULE, 'none fits')})" + (f"; {others}" if others else ""))
        return f"no valid plan: {others}" if others else "no valid plan in the search space"


class _Rows:
    """Shape rows as arrays with the attribute names the plan rules use."""

    def __init__(self, **arrays: np.ndarray) -> None:
        self.__dict__.update(arrays)

    def take(self, mask: np.ndarray) -> _Rows:
        return _Rows(**{k: v[mask] for k, v in self.__dict__.items()})

    def example(self, i: int) -> ParallelPlan:
        fields = {k: int(v[i]) for k, v in self.__dict__.items() if k != "sequence_parallel"}
        return ParallelPlan(sequence_parallel=bool(self.sequence_parallel[i]), **fields)


def _shape_rows(gpus: int, space: SearchSpace, workload: Workload, n_layers: int, n_experts: int = 0) -> _Rows:
    tps = space.tp or tuple(divisors(gpus))
    pps = space.pp or tuple(divisors(gpus))
    cps = space.cp or tuple(divisors(gpus))
    mbs = space.micro_batch or tuple(divisors(workload.batch))
    shapes = [(tp, pp, cp, gpus // (tp * pp * cp)) for tp, pp, cp in itertools.product(tps, pps, cps)
              if gpus % (tp * pp * cp) == 0]
    if not shapes:
        raise UsageError(f"no (tp, pp, cp) in the search space divides {gpus} GPUs")
    # expert parallelism: powers of two up to the routed experts (1 for a dense model), within dp x cp
    eps = space.ep or tuple(2**i for i in range(n_experts.bit_length()) if 2**i <= n_experts) or (1,)
    # the product of every dimension (C order: the stage option varies fastest), only the rows that exist: the
    # uneven-stage options only where they split the layers, default expert-parallel sizes only where they
    # divide dp x cp. Both depend on the shape, the expert-parallel size and the option alone, so they are
    # decided on that small table and the kept rows of the product numbered directly, without building it.
    shape = np.array(shapes, dtype=np.int64)
    eps_a, options = np.array(eps), np.arange(3)
    first3, last3 = _uneven_stages(shape[:, 1:2], n_layers, options[None, :])  # (shape, option)
    keep = ((options == 0) | (space.uneven_stages & (first3 > 0)))[:, None, :]  # (shape, ep, option)
    if not space.ep:  # given values meet the rules (and their count); whole experts fold EP over tp too
        folded = shape[:, 3] * shape[:, 2] * (shape[:, 0] if space.expert_tp == 1 else 1)
        keep = keep & (folded[:, None] % eps_a == 0)[:, :, None]
    sizes = (len(shapes), len(mbs), len(space.interleave), len(space.sequence_parallel), len(space.shard_group),
             len(eps), 3)
    kept = np.broadcast_to(keep[:, None, None, None, None], sizes)
    i, mb, v, sp, shard, ep, option = np.unravel_index(np.flatnonzero(kept), sizes)
    tp, pp, cp, dp = (shape[i, k] for k in range(4))
    return _Rows(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=np.array(mbs, dtype=np.int64)[mb],
                 interleave=np.array(space.interleave, dtype=np.int64)[v],
                 sequence_parallel=np.array(space.sequence_parallel, dtype=bool)[sp],
                 first_stage_layers=first3[i, option], last_stage_layers=last3[i, option],
                 shard_group=np.array(space.shard_group, dtype=np.int64)[shard], ep=eps_a[ep],
                 expert_tp=np.full(len(tp), space.expert_tp, dtype=np.int64),
                 pipeline_rounds=np.full(len(tp), space.pipeline_rounds, dtype=np.int64))


def _uneven_stages(pp: np.ndarray, n_layers: int, option: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage layers of each stage option (0: none): 0 even stages; 1 the first and the last one
    layer fewer than the middle ones (Llama 3), where that splits the layers; 2 where pp does not divide the
    layers, middle stages of ceil(L/pp) and the rest split between the first and the last, the first taking
    the odd layer (DeepSeek-V3's 3 + 14 x 4 + 2 on pp 16, Megatron-Bridge's 7 + 6 x 8 + 6 on pp 8) unless
    option 1 gave the same."""
    fewer = (n_layers + 2) // pp - 1
    ok1 = (pp > 2) & ((n_layers + 2) % pp == 0) & (fewer >= 1)
    middle = -(-n_layers // pp)
    rest = n_layers - (pp - 2) * middle
    first2, last2 = rest - rest // 2, rest // 2
    ok2 = (pp > 2) & (n_layers % pp != 0) & (last2 >= 1) & (first2 <= middle) & ~(ok1 & (first2 == last2))
    first = np.where(option == 1, np.where(ok1, fewer, 0), np.where(option == 2, np.where(ok2, first2, 0), 0))
    last = np.where(option == 1, np.where(ok1, fewer, 0), np.where(option == 2, np.where(ok2, last2, 0), 0))
    return first, last


def _placement_table(rows: _Rows, space: SearchSpace) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Per row, a key (which dimensions have size > 1) and the placements to try for each key."""
    key = sum((getattr(rows, d) > 1).astype(np.int64) << i for i, d in enumerate(DIMENSIONS))
    default = PLACEMENTS.index(DIMENSIONS)
    table = {}
    for k in np.unique(key):
        sizes = {d: 2 if (int(k) >> i) & 1 else 1 for i, d in enumerate(DIMENSIONS)}
        table[int(k)] = canonical_placements(sizes) if space.placements else [default]
    return key, table


def search(spec: ModelSpec, workload: Workload, system: SystemSpec, gpus: int, space: SearchSpace = SearchSpace(),
           *, top_k: int = 10, workers: int = 1,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Every valid plan of `space` on `gpus` GPUs, evaluated on up to `workers` processes; the `top_k` feasible
    ones by tokens/s. `progress(done, total)` is called after every chunk."""
    workload.check_fits(spec.context_length)
    start = time.perf_counter()
    rows = _shape_rows(gpus, space, workload, spec.n_layers, spec.n_experts)
    facts = Facts.of(spec, workload.batch, workload.seq)
    key, placements = _placement_table(rows, space)
    per_key = np.zeros(1 << len(DIMENSIONS), dtype=np.int64)
    per_key[list(placements)] = [len(v) for v in placements.values()]
    multiplicity = per_key[key] * (
        len(space.zero) * len(space.recompute) * len(space.flash_attention))
    valid = np.ones(len(key), dtype=bool)
    rejected: dict[str, int] = {}
    breaking: dict[str, int] = {}
    examples: dict[str, str] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for rule in CONSTRAINTS:
            ok = np.asarray(rule.test(rows, facts), dtype=bool)
            broken = ~ok
            first = broken & valid  # no earlier rule rejected these
            if broken.any():
                breaking[rule.name] = int(multiplicity[broken].sum())
            if first.any():
                rejected[rule.name] = int(multiplicity[first].sum())
                examples[rule.name] = rule.message(rows.example(int(np.argmax(first))), facts)
            valid &= ok
    rows, key = rows.take(valid), key[valid]
    # candidates = groups (shape row, placement, attention kind) x (ZeRO stage, recompute mode): a group's
    # layout is computed once, and the evaluator computes its terms once for all its members
    members = np.array(list(itertools.product(space.zero, [RECOMPUTE.index(r) for r in space.recompute])),
                       dtype=np.int64)
    k = len(members)
    flash = np.array(space.flash_attention, dtype=bool)
    sizes = np.stack([getattr(rows, d) for d in DIMENSIONS], axis=1)
    groups = []
    for placement_key, indices in placements.items():
        selected = np.nonzero(key == placement_key)[0]
        if len(selected):
            per_row = len(indices) * len(flash)
            group_rows = np.repeat(selected, per_row)
            group_placements = np.tile(np.repeat(np.array(indices, dtype=np.int64), len(flash)), len(selected))
            group_flash = np.tile(flash, len(selected) * len(indices))
            layout = members_per_domain(sizes[group_rows], group_placements, system.network.domain_size)
            groups.append((group_rows, group_placements, group_flash, layout))
    per_chunk = max(1, CHUNK // k)
    chunks = [(part, lo, min(lo + per_chunk, len(part[0]))) for part in groups
              for lo in range(0, len(part[0]), per_chunk)]
    total = sum(len(part[0]) for part in groups) * k
    enumerate_s = time.perf_counter() - start

    def run(chunk) -> tuple[int, int, tuple | None, tuple]:
        (group_rows, group_placements, group_flash, layout), lo, hi = chunk
        r = np.repeat(group_rows[lo:hi], k)
        cat = np.tile(members, (hi - lo, 1))
        cands = Candidates(dp=rows.dp[r], tp=rows.tp[r], pp=rows.pp[r], cp=rows.cp[r],
                           micro_batch=rows.micro_batch[r], interleave=rows.interleave[r], zero=cat[:, 0],
                           recompute=cat[:, 1], sequence_parallel=rows.sequence_parallel[r],
                           flash_attention=np.repeat(group_flash[lo:hi], k),
                           placement=np.repeat(group_placements[lo:hi], k), dropout=space.dropout,
                           fp32_grads=space.fp32_grads, dp_overlap=space.dp_overlap, tp_overlap=space.tp_overlap,
                           first_stage_layers=rows.first_stage_layers[r], last_stage_layers=rows.last_stage_layers[r],
                           shard_group=rows.shard_group[r], reshard_after_forward=space.reshard_after_forward,
                           fp8_recipe=space.fp8_recipe, ep=rows.ep[r], expert_imbalance=space.expert_imbalance,
                           ep_overlap=space.ep_overlap, dispatcher=space.dispatcher, expert_tp=space.expert_tp,
                           pipeline_rounds=space.pipeline_rounds, stack=space.stack,
                           layout={d: np.repeat(g[lo:hi], k) for d, g in layout.items()})
        out = evaluate_many(spec, workload, system, cands, group_size=k)
        ok = out["feasible"]
        i = int(np.argmin(out["mem_GiB"]))
        smallest = (float(out["mem_GiB"][i]), cands.subset([i]), {name: v[[i]] for name, v in out.items()})
        return len(cands), int(ok.sum()), top_answers(cands, out, ok, top_k) if ok.any() else None, smallest

    evaluated = feasible = 0
    best: list[tuple] = []
    closest: tuple | None = None
    start = time.perf_counter()
    # a search of less than a chunk's worth of candidates is over before worker processes would have started
    workers = pool_size(workers, len(chunks)) if total > CHUNK else 1
    for n, n_ok, chunk_top, smallest in map_chunks(run, chunks, workers):
        evaluated += n
        feasible += n_ok
        if chunk_top is not None:
            best = [merge_answers(best + [chunk_top], top_k)]
        if closest is None or smallest[0] < closest[0]:
            closest = smallest
        if progress:
            progress(evaluated, total)
    evaluate_s = time.perf_counter() - start
    if evaluated - feasible:
        rejected[MEMORY_RULE] = breaking[MEMORY_RULE] = evaluated - feasible
    top = []
    if best:
        # ties (e.g. selective recompute with flash attention changes nothing, or two placements that put the
        # same groups on the same links) are one answer: the simpler plan stands for them, the rest are counted
        _, _, cands, out = best[0]
        for i in range(min(top_k, len(out["plans"]))):
            metrics = {k: scalar(v[i]) for k, v in out.items() if k != "plans"}
            top.append((cands.plan(i), {**metrics, "equivalent_plans": int(out["plans"][i]) - 1}))
    near = None
    if not top and closest is not None:
        near = (closest[1].plan(0), {k: scalar(v[0]) for k, v in closest[2].items()})
        examples[MEMORY_RULE] = (f"the smallest plan needs {closest[0]:.1f} GiB per GPU of "
                                 f"{system.accelerator.capacity_bytes / 2**30:.1f} GiB")
    return SearchResult(top=top, evaluated=evaluated, feasible=feasible, rejected=rejected, examples=examples,
                        enumerate_s=enumerate_s, evaluate_s=evaluate_s, closest=near, workers=workers,
                        enumerated=int(multiplicity.sum()), breaking=breaking)
