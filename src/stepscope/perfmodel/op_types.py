"""The accounting types of `ops.py`: a collective an op issues, the cost of one direction of an op, an op, and the
geometry of one micro-batch on one GPU (what every op formula reads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepscope.perfmodel.collectives import collective_time
from stepscope.spec.system import Network


@dataclass(frozen=True)
class Collective:
    """One collective issued by an op. `bytes` follows nccl-tests: per-rank buffer for all-reduce,
    total (gathered) size for all-gather and reduce-scatter, message size for point-to-point."""

    kind: str
    """all-reduce | reduce-scatter | all-gather | all-to-all | dispatch | p2p (`collectives.py`)."""
    bytes: float
    group: str
    """Which parallel dimension's group: tp | cp | dp | pp | ep."""
    size: int
    """Ranks in the group."""
    overlappable: bool = True
    """May hide behind the op's own compute when the plan enables overlap."""
    copies: float = 1.0
    """A deduplicating dispatch's expert copies per token (`bytes` holds one copy of each token)."""
    reach: tuple[int, int] = (0, 0)
    """A dispatch's group-limited routing: (expert groups, groups per token); (0, 0) without."""

    def seconds(self, g: int, network: Network) -> float:
        """Time on a network where `g` of the group's ranks share a fast domain."""
        return collective_time(self.kind, self.bytes, self.size, g, network, self.copies, self.reach)

    def hides(self, g: int, overlap: bool) -> bool:
        """Whether it may hide behind its op's compute when the plan overlaps, `g` of its ranks sharing a fast
        domain: a tensor-parallel one only when its whole group does, since the GEMM-fused exchanges
        (Transformer Engine's userbuffers, PyTorch's symmetric-memory async TP) read and write the peers' memory
        through CUDA peer-to-peer access, which GPUs of different nodes do not share."""
        return overlap and self.overlappable and (self.group != "tp" or g >= self.size)


@dataclass(frozen=True)
class Cost:
    """One direction (forward or backward) of an op."""

    flops: float = 0.0
    """Executed FLOPs (matrix FLOPs for matrix/attention ops, elementwise FLOPs for vector ops)."""
    model_flops: float = 0.0
    """FLOPs counted toward MFU."""
    bytes: float = 0.0
    """HBM traffic."""
    kernels: int = 1
    """Kernel launches (each pays the per-kernel overhead)."""
    comms: tuple[Collective, ...] = ()
    """Collectives issued by this direction of the op."""


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
    saved_bytes: float = 0.0
    """Activation bytes kept from forward to backward (no recomputation)."""
    saved_selective_bytes: float | None = None
    """Bytes still kept under selective recomputation (None: same as saved_bytes)."""
    params: float = 0.0
    """Parameters of this op held by one GPU."""
    selective: bool = False
    """Re-executed during backward under selective recomputation."""
    fp8: bool = False
    """A GEMM that runs in fp8 when the workload's precision is fp8 (the linear layers of a block)."""
    notes: tuple[str, ...] = field(default=())
    expert: bool = False
    """Its parameters are routed experts: 1/ep of them per GPU, reduced and ZeRO-sharded over dp x cp / ep."""

    @property
    def kept_selective(self) -> float:
        return self.saved_bytes if self.saved_selective_bytes is None else self.saved_selective_bytes


@dataclass(frozen=True)
class Geometry:
    """What one micro-batch looks like on one GPU."""

    micro_batch: int
    """Sequences per micro-batch."""
    seq: int
    """Full sequence length (context parallelism splits it)."""
    act_bytes: int = 2
    """Bytes per activation element (2 for bf16/fp16, 4 for fp32)."""
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = True
    dropout: bool = False
    fp8_recipe: str | None = None
    """None: no fp8; else the scaling recipe of the fp8 linear layers (`spec.plan.FP8_RECIPES`)."""
    ep: int = 1
    """Expert-parallel group size (MoE blocks, `ops_moe.py`)."""
    expert_imbalance: float = 1.0
    """Tokens of the busiest expert-parallel rank / the mean (MoE blocks)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (`spec.plan.DISPATCHERS`)."""
    expert_tp: int = 0
    """0: experts split over tp; 1: whole experts, EP folded over the TP ranks (`ParallelPlan.expert_tp`)."""

    @property
    def expert_split(self) -> int:
        """Ranks one routed expert is split over: tp, or 1 with whole experts."""
        return 1 if self.expert_tp == 1 else self.tp

    @property
    def experts_apart(self) -> bool:
        """`ParallelPlan.experts_apart`: the routed experts are reduced and sharded over their own group."""
        return self.ep > 1 or (self.expert_tp == 1 and self.tp > 1)

    @property
    def fp8(self) -> bool:
        return self.fp8_recipe is not None

    @property
    def gemm_input_bytes(self) -> int:
        """Bytes per element of what a linear layer saves for its weight gradient: its fp8 input under fp8."""
        return 1 if self.fp8 else self.act_bytes

    @property
    def tokens(self) -> float:
        """Tokens each GPU of a TP group processes in the matrix ops: b·s/cp."""
        return self.micro_batch * self.seq / self.cp

    @property
    def sharded_tokens(self) -> float:
        """Tokens of the norm/dropout/residual ops: divided by tp under sequence parallelism."""
        return self.tokens / self.tp if self.sequence_parallel else self.tokens
