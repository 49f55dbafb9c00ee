"""The accounting types of the model: a collective an op issues, the cost of one direction of an op, an op, and
the geometry of one micro-batch on one GPU (what every op formula reads).

Every number may be a numpy array with one element per plan: the model evaluates one plan as an array of one and
a search's millions of plans as long arrays, through the same formulas (`model/evaluate.py`). What changes the
*list* of ops (fused or unfused attention, fp8 casts, a Mixture-of-Experts block) is a plain value shared by every
plan of one evaluation; what only changes sizes (tp, cp, ep, sequence parallelism, micro-batch) is an array. A
collective whose group has one rank, or that carries no bytes, costs nothing, so an op lists every collective it
may issue and the sizes decide which ones run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.perfmodel.model.collectives import collective_time
from stepscope.spec.system import Network

Number = Any
"""A float or a numpy array of floats (one per plan)."""


OVERLAP = ("plan", "always", "never")
"""When a collective may hide behind its op's compute: where the plan overlaps (`ParallelPlan.tp_overlap`; a
tensor-parallel one only inside one fast domain), always (a schedule built to overlap it: Transformer Engine's
context-parallel ring), or never (it must finish before its op starts: MoE token exchanges, an all-gather of K/V
before attention)."""


@dataclass(frozen=True)
class Collective:
    """One collective issued by an op. `bytes` follows nccl-tests: per-rank buffer for all-reduce,
    total (gathered) size for all-gather and reduce-scatter, message size for point-to-point and one ring step."""

    kind: str
    """all-reduce | reduce-scatter | all-gather | all-to-all | dispatch | p2p | ring-step (`collectives.py`)."""
    bytes: Number
    group: str
    """Which parallel dimension's group: tp | cp | dp | pp | ep."""
    size: Number
    """Ranks in the group."""
    overlap: str = "plan"
    """When it may hide behind its op's compute (`OVERLAP`)."""
    copies: float = 1.0
    """A deduplicating dispatch's expert copies per token (`bytes` holds one copy of each token)."""
    reach: tuple[int, int] = (0, 0)
    """A dispatch's group-limited routing: (expert groups, groups per token); (0, 0) without."""
    repeats: Number = 1
    """How many times it runs per op direction (a ring's steps)."""
    window_share: Number = 1.0
    """The share of its op's compute each run can hide behind (a ring step: the attention block computing
    meanwhile, 1/cp of the op; an all-gather issued before the first block and waited after it: 1/cp)."""

    def __post_init__(self) -> None:
        if self.overlap not in OVERLAP:
            raise ValueError(f"overlap must be one of {', '.join(OVERLAP)}, got {self.overlap!r}")

    def seconds(self, g: Number, network: Network) -> Number:
        """Time of one run on a network where `g` of the group's ranks share a fast domain."""
        if self.kind == "ring-step":  # every rank sends to its neighbour at once: the slowest hop sets the pace
            return collective_time("p2p", self.bytes, self.size, np.where(np.asarray(g) >= self.size, 2, 1),
                                   network) * (np.asarray(self.size) > 1)
        return collective_time(self.kind, self.bytes, self.size, g, network, self.copies, self.reach)

    def hides(self, g: Number, overlap: Any) -> Any:
        """Whether it may hide behind its op's compute (`OVERLAP`), the plan overlapping or not, `g` of its ranks
        sharing a fast domain: a tensor-parallel one only when its whole group does, since the GEMM-fused
        exchanges (Transformer Engine's userbuffers, PyTorch's symmetric-memory async TP) read and write the peers'
        memory through CUDA peer-to-peer access, which GPUs of different nodes do not share, and only a sequence-
        parallel all-gather or reduce-scatter (`tensor_overlap.py`)."""
        if self.overlap != "plan":
            return self.overlap == "always"
        if self.group != "tp":
            return overlap
        if self.kind == "all-reduce":  # the GEMM-fused exchanges split all-gathers and reduce-scatters only
            return False
        return np.logical_and(overlap, np.asarray(g) >= np.asarray(self.size))

    def exposed(self, g: Number, network: Network, compute_s: Number, overlap: Any) -> Number:
        """Seconds it shows beside its op's `compute_s` over all its runs (`repeats`, each behind `window_share`
        of the compute where it hides)."""
        one = self.seconds(g, network)
        shown = np.where(self.hides(g, overlap), np.maximum(0.0, one - self.window_share * compute_s), one)
        return self.repeats * shown

    def total(self, g: Number, network: Network) -> Number:
        """Seconds of all its runs."""
        return self.repeats * self.seconds(g, network)

    @property
    def runs(self) -> Any:
        """Where it moves anything: more than one rank and some bytes."""
        return (np.asarray(self.size) > 1) & (np.asarray(self.bytes) > 0) & (np.asarray(self.repeats) > 0)


@dataclass(frozen=True)
class Cost:
    """One direction (forward or backward) of an op."""

    flops: Number = 0.0
    """Executed FLOPs (matrix FLOPs for matrix/attention ops, elementwise FLOPs for vector ops)."""
    model_flops: Number = 0.0
    """FLOPs counted toward MFU."""
    bytes: Number = 0.0
    """HBM traffic."""
    kernels: Number = 1
    """Kernel launches (each pays the per-kernel overhead)."""
    comms: tuple[Collective, ...] = ()
    """Collectives this direction of the op may issue."""
    gemms: tuple[tuple[Any, Any, Any, Any], ...] = ()
    """The GEMMs a matrix op runs, each (M, N, K, G): G products of an M x K and a K x N matrix (G > 1: a grouped
    or batched GEMM); their 2·M·N·K·G add up to `flops`. Empty: priced by FLOPs alone (`rates.op_time`)."""
    latency_s: Number = 0.0
    """Seconds the GPU waits on the host regardless of the work (a host synchronisation and the launches that
    follow it before the queue refills)."""


@dataclass(frozen=True)
class Op:
    """One op of a block, forward and backward."""

    name: str
    block: str
    """embedding | attention | mlp | moe | head."""
    kind: str
    """matrix | attention (fused flash kernel) | vector."""
    forward: Cost
    backward: Cost
    saved_bytes: Number = 0.0
    """Activation bytes kept from forward to backward (no recomputation)."""
    saved_selective_bytes: Number | None = None
    """Bytes still kept under selective recomputation (None: same as saved_bytes)."""
    params: Number = 0.0
    """Parameters of this op held by one GPU."""
    selective: bool = False
    """Re-executed during backward under selective recomputation."""
    fp8: bool = False
    """A GEMM that runs in fp8 (the linear layers of a block when the workload's precision is fp8)."""
    expert: bool = False
    """Its parameters are routed experts: 1/ep of them per GPU, reduced and ZeRO-sharded over dp x cp / ep."""
    notes: tuple[str, ...] = field(default=())

    @property
    def kept_selective(self) -> Number:
        return self.saved_bytes if self.saved_selective_bytes is None else self.saved_selective_bytes


@dataclass(frozen=True)
class Geometry:
    """What one micro-batch looks like on one GPU; array fields hold one element per plan."""

    micro_batch: Number
    """Sequences per micro-batch."""
    seq: int
    """Full sequence length (context parallelism splits it)."""
    act_bytes: int = 2
    """Bytes per activation element (2 for bf16/fp16, 4 for fp32)."""
    tp: Number = 1
    cp: Number = 1
    sequence_parallel: Any = False
    flash_attention: bool = True
    """One fused attention kernel; shared by every plan of an evaluation (it changes the list of ops)."""
    dropout: bool = False
    fp8_recipe: str | None = None
    """None: no fp8; else the scaling recipe of the fp8 linear layers (`spec.plan.FP8_RECIPES`)."""
    ep: Number = 1
    """Expert-parallel group size (MoE blocks, `ops_moe.py`)."""
    expert_imbalance: float = 1.0
    """Tokens of the busiest expert-parallel rank / the mean (MoE blocks)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (`spec.plan.DISPATCHERS`)."""
    expert_tp: int = 0
    """0: experts split over tp; 1: whole experts, EP folded over the TP ranks (`ParallelPlan.expert_tp`)."""
    context_parallel: str = "p2p-ring"
    """How the stack exchanges K/V between context-parallel ranks (`spec.stack.StackSpec.context_parallel`)."""

    @property
    def expert_split(self) -> Number:
        """Ranks one routed expert is split over: tp, or 1 with whole experts."""
        return 1 if self.expert_tp == 1 else self.tp

    @property
    def experts_apart(self) -> Any:
        """`ParallelPlan.experts_apart`: the routed experts are reduced and sharded over their own group."""
        return (np.asarray(self.ep) > 1) | ((self.expert_tp == 1) & (np.asarray(self.tp) > 1))

    @property
    def fp8(self) -> bool:
        return self.fp8_recipe is not None

    @property
    def gemm_input_bytes(self) -> int:
        """Bytes per element of what a linear layer saves for its weight gradient: its fp8 input under fp8."""
        return 1 if self.fp8 else self.act_bytes

    @property
    def tokens(self) -> Number:
        """Tokens each GPU of a TP group processes in the matrix ops: b·s/cp."""
        return self.micro_batch * self.seq / self.cp

    @property
    def sharded_tokens(self) -> Number:
        """Tokens of the norm/dropout/residual ops: divided by tp under sequence parallelism."""
        return np.where(self.sequence_parallel, self.tokens / self.tp, self.tokens)
