"""The point of the data-parallel benchmark (`DDPBenchConfig`): torch-free, so the command line reads its
defaults without importing torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.spec import PRECISIONS, ModelSpec

ALL_VARIANTS = ("naive", "flat", "individual", "bucketed", "torch")
CAPPED = ("bucketed", "torch")
BASELINES = ("naive", "flat", "individual")
MAX_BUCKET_MIB = 1 << 20
"""A cap above 1 TiB is a typo (a bucket never holds more than the model; `none` is one bucket), and its bytes
must fit the int64 that PyTorch DDP takes."""
MiB = 2**20


@dataclass(frozen=True)
class DDPBenchConfig:
    """One point of the data-parallel benchmark: a model and batch, timed under every listed variant."""

    model: ModelSpec
    """The model to train (preset plus overrides)."""
    batch: int = 2
    """GLOBAL batch in sequences, split evenly across ranks."""
    seq: int = 128
    """Tokens per sequence."""
    world: int = 2
    """Ranks to spawn locally (under torchrun the launcher's world size is used)."""
    precision: str = "fp32"
    """fp32, or bf16/fp16 autocast (gradients stay fp32: the weights are fp32)."""
    variants: tuple[str, ...] = ALL_VARIANTS
    """naive, flat, individual, bucketed (ours), torch (torch.nn.parallel.DistributedDataParallel)."""
    bucket_MiB: tuple[float | None, ...] = (1.0, 10.0, 100.0)
    """Bucket caps in MiB for bucketed and torch (None = one bucket)."""
    bucket_rule: str = "strict"
    """How DDPBucketed fills buckets: strict (never above the cap) or torch (close once reached)."""
    shard_optimizer: bool = False
    """Time the steps with ShardedOptimizer(AdamW) instead of AdamW (memory is reported for both)."""
    warmup: int = 1
    """Untimed interleaved rounds after the correctness check (which already ran each variant once)."""
    iters: int = 5
    """Timed rounds; each round runs every variant once, in a rotating order."""
    comm_iters: int = 3
    """Timed repetitions of communication alone and of each all-reduce size of the alpha-beta fit."""
    threads: int | None = None
    """Intra-op threads per rank (None: usable cores / ranks)."""
    backend: str = "auto"
    """auto, gloo or nccl."""
    seed: int = 0
    """Weights are seeded with seed + rank (rank 0's are broadcast); data likewise, so shards differ."""
    lr: float = 1e-4
    """AdamW learning rate."""
    timeout_s: float = 600.0
    """Collective timeout: a rank waiting this long on a peer fails instead of hanging."""
    oversubscribe: bool = False
    """Allow more locally spawned ranks than launch.ranks.MAX_RANKS_PER_CORE per core."""

    def validate(self) -> None:
        """Everything checkable before spawning ranks (UsageError)."""
        from stepscope.distributed.launch.ranks import check_local_world, external_launch_env

        if self.world < 1:
            raise UsageError(f"--world must be at least 1, got {self.world}")
        if external_launch_env() is None:  # too many local ranks is the first thing to say
            check_local_world(self.world, oversubscribe=self.oversubscribe)
        if self.batch % self.world:
            raise UsageError(f"global batch {self.batch} is not divisible by world size {self.world}")
        if self.seq > self.model.context_length:
            raise UsageError(f"seq={self.seq} exceeds the model's context_length={self.model.context_length}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {'|'.join(PRECISIONS)}, got {self.precision!r}")
        unknown = [v for v in self.variants if v not in ALL_VARIANTS]
        if unknown or not self.variants:
            raise UsageError(f"unknown variant {unknown[0] if unknown else ''!r}; choose from "
                             f"{','.join(ALL_VARIANTS)}")
        if any(cap is not None and not 0 < cap <= MAX_BUCKET_MIB for cap in self.bucket_MiB) or not self.bucket_MiB:
            raise UsageError(f"bucket sizes must be positive MiB up to {MAX_BUCKET_MIB:,} (or none: one bucket), "
                             f"got {list(self.bucket_MiB)}")
        if self.bucket_rule not in ("strict", "torch"):
            raise UsageError(f"bucket rule must be strict or torch, got {self.bucket_rule!r}")
        if self.warmup < 0 or self.iters < 1 or self.comm_iters < 1:
            raise UsageError("need warmup >= 0, iters >= 1 and comm-iters >= 1")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"threads must be positive, got {self.threads}")

    def points(self) -> list[tuple[str, float | None]]:
        """(variant, cap) in the order they are built and reported."""
        return [(v, cap) for v in self.variants for cap in (self.bucket_MiB if v in CAPPED else (None,))]

    def record_config(self, variant: str, cap_mb: float | None) -> dict[str, Any]:
        config = {"model": self.model.name, "batch": self.batch, "seq": self.seq, "world": self.world,
                  "precision": self.precision, "variant": variant,
                  "bucket_MiB": cap_mb if variant in CAPPED else None,
                  "bucket_rule": self.bucket_rule if variant == "bucketed" else None}
        config.update({k: v for k, v in dataclasses.asdict(self).items()
                       if k in ("shard_optimizer", "warmup", "iters", "comm_iters", "threads", "backend",
                                "seed", "lr")})
        config["model_spec"] = self.model.to_dict()
        return config
