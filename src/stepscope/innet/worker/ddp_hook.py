"""A DDP communication hook that averages each gradient bucket through the switch.

PyTorch's contract, `hook(state, bucket) -> Future[Tensor]` with the AVERAGED flat gradient, so the same
function registers on `torch.nn.parallel.DistributedDataParallel` and on stepscope's `DDPBucketed`:

    state = InnetHookState(job)                  # a joined InnetJob of this rank
    ddp.register_comm_hook(state, innet_hook)    # torch DDP or stepscope.distributed.data_parallel.DDPBucketed

The bucket is reduced in place (`buffer()` is the future's value). Averages divide by the number of
ranks that contributed to each block, so with fastest-K (`state.k`) a straggler's missing gradient is
left out rather than counted as zero. The bucket's op returns asynchronously: DDP overlaps it with the
rest of backward. Every rank, the straggler included, receives the same averaged result, so replicas stay
identical.
"""

# No `from __future__ import annotations` here: torch DDP checks the hook's annotations at registration
# (the bucket must be annotated dist.GradBucket and the result torch.futures.Future[torch.Tensor]).
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stepscope.innet.worker.client import InnetJob
from stepscope.innet.worker.op import Op


@dataclass
class InnetHookState:
    """What the hook needs: the rank's joined job and the straggler-tolerance settings (mutable)."""

    job: InnetJob
    """This rank's joined job."""
    k: int | None = None
    """Fastest-K for the buckets (None = world: wait for every rank)."""
    preemptive: bool = False
    """Complete blocks at K contributions without waiting for the straggler timeout."""
    ops: list = field(default_factory=list)
    """Summary of every bucket reduced (op, values, timed-out blocks, min contributors, seconds)."""
    keep_ops: int = 1000
    """Most summaries kept."""


def innet_hook(state: InnetHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average `bucket.buffer()` across the job through the switch; the future holds the buffer."""
    tensor = bucket.buffer()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    staged = tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu")

    def finished(op: Op) -> None:
        if op.error is not None:
            future.set_exception(op.error)
            return
        if len(state.ops) < state.keep_ops:
            state.ops.append({"bucket": bucket.index(), **op.summary()})
        if staged is not tensor:
            tensor.copy_(staged)
        future.set_result(tensor)

    state.job.submit(staged, op="avg", k=state.k, preemptive=state.preemptive, callback=finished)
    return future
