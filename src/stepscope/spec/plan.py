"""`ParallelPlan`: how one training step is spread over GPUs and executed. Pure Python; the rules a plan must
obey are `plan_rules.CONSTRAINTS`, which `ParallelPlan.check` applies.

Placement: ranks are numbered with the dimensions nested in `placement` order, innermost first. The
default ("tp", "cp", "dp", "pp") keeps tensor-parallel groups inside an NVLink domain, as Megatron-LM does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec.plan_rules import CONSTRAINTS, Facts, stage_layers
from stepscope.spec.stack import DEFAULT_STACK, load_stack

__all__ = ["CONSTRAINTS", "DIMENSIONS", "DISPATCHERS", "FP8_RECIPES", "RECOMPUTE", "Facts", "ParallelPlan",
           "stage_layers"]

RECOMPUTE = ("none", "selective", "full")
DIMENSIONS = ("tp", "cp", "dp", "pp")
DISPATCHERS = ("alltoall", "deepep", "deepep-fp8")
"""How MoE tokens reach their experts across ranks: `alltoall` sends every expert copy of a token by an NCCL
all-to-all (Megatron-Core's alltoall dispatcher); `deepep` sends a token once per destination node and fans it
out there over NVLink (DeepEP, HybridEP: Megatron-Core's flex dispatcher, which hands them 16-bit tokens), as
`collectives.dispatch` models it; `deepep-fp8` also sends the forward dispatch in fp8 when the GEMMs are fp8
(DeepSeek-V3's own training, §3.3.2: fp8 dispatch, 16-bit combine)."""
FP8_RECIPES = ("delayed", "current", "blockwise")
"""How fp8 GEMM inputs are scaled (used when the workload's precision is fp8): per-tensor scales from the amax
history of earlier steps (Transformer Engine's delayed scaling), per-tensor scales from the tensor itself (an
extra amax pass; torchao's tensorwise/dynamic), or per-block scales (1x128 activations, 128x128 weights, as in
DeepSeek-V3), computed in the cast kernel."""


@dataclass(frozen=True)
class ParallelPlan:
    """Parallel layout and execution strategy of one training step."""

    dp: int = 1
    """Data-parallel replicas."""
    tp: int = 1
    """Tensor-parallel (Megatron 1-D) group size."""
    pp: int = 1
    """Pipeline stages (1F1B schedule)."""
    cp: int = 1
    """Context-parallel group size (the sequence is split, K/V are exchanged)."""
    sequence_parallel: bool = False
    """Shard norms, dropout and residuals over the TP group (all-gather/reduce-scatter instead of all-reduce)."""
    zero: int = 0
    """ZeRO stage: 0 none, 1 optimizer state sharded (= Megatron distributed optimizer), 2 + grads, 3 + weights."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core), full (whole layer)."""
    interleave: int = 1
    """Virtual pipeline chunks per stage (interleaved 1F1B); 1 = plain 1F1B."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    pipeline_rounds: int = 1
    """Pipeline schedules run one after the other per step, each over its share of the micro-batches, the
    gradients accumulated across them: gradient accumulation outside the schedule, as torchtitan and NeMo
    AutoModel run it with pp > 1 (each round fills and drains the pipeline). 1: one schedule of all
    micro-batches (Megatron)."""
    flash_attention: bool = True
    """One fused attention kernel (no s x s matrices stored) instead of scores/softmax/dropout/values ops."""
    dropout: bool = False
    """The run applies dropout (as Megatron GPT runs do): masks are stored and streamed."""
    fp32_grads: bool = False
    """Gradients are accumulated and reduced in fp32 (Megatron's main_grad) instead of the model precision."""
    dp_overlap: bool = True
    """Gradient reduction overlaps the last micro-batch's backward (all but the last bucket)."""
    tp_overlap: bool = False
    """Tensor/context-parallel collectives overlap the matrix op they belong to."""
    placement: tuple[str, ...] = DIMENSIONS
    """Order in which the dimensions are nested on rank numbers, innermost first."""
    first_stage_layers: int = 0
    """Layers of the first pipeline stage (0: an even split). Megatron's --decoder-first-pipeline-num-layers;
    Llama 3 405B ran pp16 with one layer fewer on the first and on the last stage (7 + 14 x 8 + 7 = 126)."""
    last_stage_layers: int = 0
    """Layers of the last pipeline stage (0: an even split); the middle stages share the rest evenly."""
    shard_group: int = 0
    """ZeRO/FSDP shards over groups of this many of the dp x cp ranks (HSDP: replicas across groups, the
    gradient shards all-reduced between them); 0: over all dp x cp ranks."""
    reshard_after_forward: bool = True
    """ZeRO-3/FSDP frees the gathered weights after forward and gathers them again for backward; False keeps
    them until backward ends (FSDP's reshard_after_forward=False, ZeRO-2-like memory, one gather fewer)."""
    fp8_recipe: str = "delayed"
    """Scaling of fp8 GEMMs when the workload's precision is fp8 (see FP8_RECIPES)."""
    ep: int = 1
    """Expert-parallel group size (Mixture-of-Experts): the routed experts of each MoE block are split over `ep`
    ranks carved out of the dp x cp ranks (Megatron-Core's expert parallelism: the innermost `ep` of them form
    an EP group exchanging tokens by all-to-all; expert gradients are reduced over the dp x cp / ep
    expert-data-parallel ranks). Experts are tensor-parallel like the dense MLP (expert-TP = tp)."""
    expert_imbalance: float = 1.0
    """Load imbalance of the routed experts: tokens of the busiest EP rank / the mean (1.0: perfectly balanced,
    what an auxiliary-loss or bias-balanced router approaches); scales that rank's expert GEMMs and all-to-all."""
    expert_tp: int = 0
    """0: routed experts tensor-parallel over tp like the dense MLP; 1: each expert whole on one GPU and the EP
    group folded over the tp x dp x cp ranks (Megatron-Core's --expert-tensor-parallel-size 1, 'MoE parallel
    folding': no TP exchange around the experts, each TP rank dispatches its own sequence-parallel tokens)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (see DISPATCHERS)."""
    ep_overlap: bool = False
    """The dispatch and combine all-to-alls hide behind the MoE block's GEMMs of the same direction (only what
    exceeds them shows), as schedules that run one micro-batch's all-to-all during another's computation do
    (DeepSeek-V3's DualPipe, Megatron-Core's --overlap-moe-expert-parallel-comm); False: exposed."""
    stack: str = DEFAULT_STACK
    """The training software the plan runs on: a stack preset or TOML file (`spec.stack`); it decides how the
    data-parallel, context-parallel, overlapped tensor-parallel and pipeline exchanges are scheduled and which
    fused-attention kernel runs."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "interleave", "micro_batch", "pipeline_rounds", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise UsageError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"recompute must be one of {'|'.join(RECOMPUTE)}, got {self.recompute!r}")
        for name in ("first_stage_layers", "last_stage_layers", "shard_group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{name} must be a non-negative integer, got {value!r}")
        if (isinstance(self.expert_imbalance, bool) or not self.expert_imbalance >= 1.0
                or not math.isfinite(self.expert_imbalance)):
            raise UsageError(f"expert_imbalance must be a finite number of at least 1 (max/mean tokens per expert), "
                             f"got {self.expert_imbalance!r}")
        if self.expert_tp not in (0, 1):
            raise UsageError(f"expert_tp must be 0 (experts split over tp) or 1 (whole experts), "
                             f"got {self.expert_tp!r}")
        if self.dispatcher not in DISPATCHERS:
            raise UsageError(f"dispatcher must be one of {'|'.join(DISPATCHERS)}, got {self.dispatcher!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise UsageError(f"fp8_recipe must be one of {'|'.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        load_stack(self.stack)  # a UsageError naming the presets for an unknown stack
        if tuple(sorted(self.placement)) != tuple(sorted(DIMENSIONS)):
            raise UsageError(f"placement must order all of {','.join(DIMENSIONS)}, got {','.join(self.placement)}")
        object.__setattr__(self, "placement", tuple(self.placement))

    @property
    def gpus(self) -> int:
        """GPUs the plan uses: dp x tp x pp x cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same weights (dp x cp, Megatron's data-parallel group with context parallelism):
        gradients are reduced, and ZeRO shards its state, over them."""
        return self.dp * self.cp

    @property
    def shard(self) -> int:
        """Ranks one ZeRO/FSDP shard group spans (all dp x cp ranks unless `shard_group` is set)."""
        return self.shard_group or self.dp_cp

    @property
    def experts_apart(self) -> bool:
        """The routed experts have a data-parallel group of their own (`expert_dp`): EP, or whole on TP ranks."""
        return self.ep > 1 or (self.expert_tp == 1 and self.tp > 1)

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts (dp x cp / ep; tp x dp x cp / ep with whole experts): expert gradients
        are reduced, and their ZeRO state sharded, over them."""
        return self.dp_cp * (self.tp if self.expert_tp == 1 else 1) // self.ep

    @property
    def replicas(self) -> int:
        """Shard groups holding the same weights (HSDP replicas; 1 for plain ZeRO/FSDP)."""
        return self.dp_cp // self.shard

    def stage_layers(self, n_layers: int) -> tuple[int, int, int]:
        """(first, middle, last) stage layer counts; with pp = 1 all three are n_layers, with pp = 2 there is
        no middle stage (its count repeats the first). Validity is `check`'s."""
        return stage_layers(self.pp, self.first_stage_layers, self.last_stage_layers, n_layers)

    def size(self, dimension: str) -> int:
        """Group size of one dimension (tp, cp, dp or pp)."""
        return getattr(self, dimension)

    def stride(self, dimension: str) -> int:
        """Rank distance between neighbours of a group of `dimension` (product of the sizes inside it)."""
        stride = 1
        for inner in self.placement:
            if inner == dimension:
                return stride
            stride *= self.size(inner)
        raise KeyError(dimension)  # pragma: no cover - placement is validated

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches each pipeline processes per step (gradient-accumulation steps)."""
        return global_batch // (self.dp * self.micro_batch)

    def replace(self, **changes: Any) -> ParallelPlan:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field (the `plan` of a record); the placement as `tp,cp,dp,pp`."""
        data = dataclasses.asdict(self)
        data["placement"] = ",".join(self.placement)
        return data

    def describe(self) -> str:
        """One line, e.g. `dp8 tp8 pp16 cp1 mb1 sp zero1 recompute selective v2`."""
        extras = ["sp" if self.sequence_parallel else "", f"zero{self.zero}" if self.zero else "",
                  f"shard{self.shard_group}" if self.shard_group else "",
                  "no-reshard" if self.zero == 3 and not self.reshard_after_forward else "",
                  f"first{self.first_stage_layers}" if self.first_stage_layers else "",
                  f"last{self.last_stage_layers}" if self.last_stage_layers else "",
                  f"recompute {self.recompute}" if self.recompute != "none" else "",
                  f"v{self.interleave}" if self.interleave > 1 else "",
                  f"rounds{self.pipeline_rounds}" if self.pipeline_rounds > 1 and self.pp > 1 else "",
                  "" if self.flash_attention else "no-flash",
                  f"imbalance{self.expert_imbalance:g}" if self.expert_imbalance != 1.0 else "",
                  self.dispatcher if self.dispatcher != "alltoall" else "", "ep-overlap" if self.ep_overlap else "",
                  self.stack if self.stack != DEFAULT_STACK else ""]
        ep = (f"ep{self.ep} " if self.ep > 1 else "") + ("etp1 " if self.expert_tp == 1 and self.tp > 1 else "")
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} {ep}mb{self.micro_batch} "
                + " ".join(e for e in extras if e)).strip()

    def check(self, model: Any, global_batch: int, seq: int, gpus: int | None = None) -> ParallelPlan:
        """Raise UsageError naming the first broken rule; returns self so calls can chain."""
        if gpus is not None and self.gpus != gpus:
            raise UsageError(f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {self.gpus} "
                             f"but {gpus} GPUs were given")
        facts = Facts.of(model, global_batch, seq)
        for constraint in CONSTRAINTS:
            if not constraint.test(self, facts):
                raise UsageError(constraint.message(self, facts))
        return self
