"""The rank side of `stepscope ddp`: everything one data-parallel rank measures, in this order.

1. Build the model once (weights differ per rank until a wrapper broadcasts rank 0's) and EVERY variant
   on that same module: our wrappers arm their hooks only between their own forward and
   `finish_gradient_synchronization()`, and PyTorch's reducer ignores its hooks unless its own forward
   ran, so variants share one copy of weights, gradients and optimizer state.
2. Memory after init, before and after the first optimizer step, with AdamW and with ShardedOptimizer.
3. Correctness once before timing: each variant's averaged gradients against a plain flat all-reduce of
   the same local gradients (this step also warms each variant up, including PyTorch's bucket rebuild).
4. Timed steps, variants interleaved round-robin (the order rotates each round), a barrier before each
   step so ranks start together; `compute` is the same step with no communication at all.
5. Communication alone: each variant's own sequence of all-reduces (same sizes, blocking or async as the
   variant issues them) on idle ranks, interleaved the same way.
6. All-reduce time for a range of message sizes, for the alpha-beta fit behind b* = sqrt(s·w·o).
Returns plain Python data (seconds) for the parent to combine across ranks.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stepscope.distributed.data_parallel import VARIANTS, DataParallel
from stepscope.distributed.data_parallel.memory import MiB, memory_split
from stepscope.distributed.data_parallel.sharded_optimizer import ShardedOptimizer
from stepscope.distributed.data_parallel.torch_ddp import torch_ddp
from stepscope.distributed.launch.rank import RankContext
from stepscope.measure.device import is_out_of_memory, synchronize
from stepscope.measure.timer import interleaved_rounds
from stepscope.measure.training import TrainingStep, transformer_step
from stepscope.spec import Workload

COMPUTE = "compute"
BLOCKING = ("naive", "flat")  # variants that issue their all-reduces one after another, waiting for each
ALPHA_BETA_BYTES = (4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20)
CHECK_RTOL = 1e-5
"""Both sides reduce the same local gradients (forward and backward are deterministic on fixed threads), so
only the order of the division and the sum can differ: fp32 rounding whatever the autocast precision
(gradients are fp32 because the weights are)."""


def label_of(variant: str, cap_mb: float | None) -> str:
    if variant not in ("bucketed", "torch"):
        return variant
    return f"{variant} {'one bucket' if cap_mb is None else f'{cap_mb:g} MiB'}"


def build_variant(variant: str, cap_mb: float | None, module: nn.Module, rule: str) -> nn.Module:
    if variant == "torch":
        total_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / MiB
        return torch_ddp(module, total_mb + 1 if cap_mb is None else cap_mb)  # buffers broadcast once, as ours
    if variant == "bucketed":
        return VARIANTS[variant](module, cap_mb, rule=rule)
    return VARIANTS[variant](module)


def torch_bucket_bytes(ddp: nn.Module) -> list[int] | None:
    """The bucket sizes PyTorch DDP reports after its rebuild (None before it has one)."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    return [int(size) for size in str(sizes).split(",")] if sizes else None


def message_numels(wrapper: nn.Module, element_size: int) -> list[int]:
    if isinstance(wrapper, DataParallel):
        return wrapper.message_numels()
    return [size // element_size for size in torch_bucket_bytes(wrapper) or []]


def comm_buffer_mib(wrapper: nn.Module) -> float:
    """Gradient-sized buffers a variant keeps across steps (PyTorch's buckets hold copies of the grads)."""
    if isinstance(wrapper, DataParallel):
        return sum(b.numel() * b.element_size() for b in wrapper.communication_buffers()) / MiB
    return sum(torch_bucket_bytes(wrapper) or []) / MiB


def averaged_plain_gradients(model: nn.Module, world: int) -> torch.Tensor:
    """The reference: local gradients flattened, summed across ranks by one all-reduce, divided."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    dist.all_reduce(flat)
    return flat.div_(world)


def plain_step_gradients(step: TrainingStep) -> None:
    """Forward and backward on the bare module (no wrapper armed): local gradients only."""
    step.model.zero_grad(set_to_none=True)
    step.use(None)
    step.forward()
    step.loss.backward()  # unscaled even for fp16: checks and memory probes compare raw gradients


def probe_memory(step: TrainingStep, world: int, lr: float) -> dict[str, dict[str, dict[str, float]]]:
    """{optimizer: {init|before_step|after_step: split}} over a first step with a fresh optimizer."""
    out = {}
    makers: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "adamw": lambda: torch.optim.AdamW(step.model.parameters(), lr=lr),
        "sharded": lambda: ShardedOptimizer(step.model.parameters(), torch.optim.AdamW, lr=lr)}
    for name, make in makers.items():
        step.model.zero_grad(set_to_none=True)
        optimizer = make()
        points = {"init": memory_split(step.model, optimizer)}
        plain_step_gradients(step)
        flat = averaged_plain_gradients(step.model, world)
        with torch.no_grad():
            offset = 0
            for p in step.model.parameters():
                if p.grad is not None:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                    offset += p.numel()
        del flat
        points["before_step"] = memory_split(step.model, optimizer)
        optimizer.step()
        points["after_step"] = memory_split(step.model, optimizer)
        step.model.zero_grad(set_to_none=True)
        del optimizer
        gc.collect()
        out[name] = points
    return out


def check_variants(step: TrainingStep, wrappers: dict[str, nn.Module],
                   world: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per variant: max relative error of its averaged gradients against the plain reference, and the
    gradient memory it holds once synchronized (gradients plus persistent communication buffers, each
    storage once: our wrappers leave `.grad` as views into their buckets)."""
    plain_step_gradients(step)
    reference = averaged_plain_gradients(step.model, world)
    scale = reference.abs().max().item() or 1.0
    errors, grads_mib = {}, {}
    for label, wrapper in wrappers.items():
        step.model.zero_grad(set_to_none=True)
        step.use(wrapper)
        step.forward()
        step.loss.backward()  # unscaled, as the reference's
        if isinstance(wrapper, DataParallel):  # PyTorch's reducer has already finished inside backward
            wrapper.finish_gradient_synchronization()
        got = torch.cat([p.grad.reshape(-1) for p in step.model.parameters() if p.grad is not None])
        errors[label] = ((got - reference).abs().max().item() / scale if got.shape == reference.shape
                         else float("inf"))
        if isinstance(wrapper, DataParallel):
            grads_mib[label] = memory_split(step.model, None, wrapper.communication_buffers())["grads"]
        else:  # PyTorch's buckets are not visible as tensors: add the sizes it reports
            grads_mib[label] = memory_split(step.model, None)["grads"] + comm_buffer_mib(wrapper)
    step.model.zero_grad(set_to_none=True)
    return errors, grads_mib


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process, every thread) of `fn`. CPU ÷ wall = cores this
    rank kept busy: what shows whether communication has an idle core to overlap on."""
    dist.barrier()  # ranks start together: a step's time is its own, not the wait for a late peer
    synchronize(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    return time.perf_counter() - start, time.process_time() - start_cpu


Samples = dict[str, list[tuple[float, float]]]
"""label -> [(wall seconds, CPU seconds)] per timed run."""


def interleaved_steps(step: TrainingStep, wrappers: dict[str, nn.Module], warmup: int, iters: int) -> Samples:
    """Whole train steps of the bare model (`compute`) and of every variant, through the interleaved harness."""

    sharded = step.optimizer if isinstance(step.optimizer, ShardedOptimizer) else None

    def one_step(label: str, _: int) -> tuple[float, float]:
        step.use(None if label == COMPUTE else wrappers[label])
        if sharded is not None:  # a compute-only round sends nothing: the shard's update without its broadcast
            sharded.broadcast = label != COMPUTE
        return timed(step.device, step.run)  # forward, backward + synchronization, AdamW and zero_grad

    return interleaved_rounds([COMPUTE, *wrappers], one_step, warmup=warmup, iters=iters)


def communication_alone(messages: dict[str, list[int]], blocking: dict[str, bool], dtype: torch.dtype,
                        device: torch.device, warmup: int, iters: int) -> Samples:
    """Each variant's all-reduces with nothing else running, interleaved like the steps."""
    scratch = torch.ones(max(sum(sizes) for sizes in messages.values()), dtype=dtype, device=device)

    def run(label: str) -> None:
        views, offset = [], 0
        for numel in messages[label]:
            views.append(scratch[offset:offset + numel])
            offset += numel
        if blocking[label]:
            for view in views:
                dist.all_reduce(view)
        else:
            for work in [dist.all_reduce(view, async_op=True) for view in views]:
                work.wait()

    return interleaved_rounds(list(messages), lambda label, _: timed(device, lambda: run(label)), warmup=warmup,
                              iters=iters)


def allreduce_sizes(dtype: torch.dtype, device: torch.device, repeats: int) -> dict[int, list[float]]:
    """Seconds per all-reduce for each size in ALPHA_BETA_BYTES. Each sample times a burst of calls and
    divides, so the skew with which ranks leave the barrier is spread over many calls."""
    element = torch.empty((), dtype=dtype).element_size()
    out: dict[int, list[float]] = {}
    for nbytes in ALPHA_BETA_BYTES:
        out[nbytes] = _seconds_per_all_reduce(torch.ones(nbytes // element, dtype=dtype, device=device), repeats)
    return out


def _seconds_per_all_reduce(tensor: torch.Tensor, repeats: int) -> list[float]:
    burst = max(1, min(20, (16 << 20) // (tensor.numel() * tensor.element_size())))
    dist.all_reduce(tensor)  # untimed: the first call of a size sets up its buffers
    return [timed(tensor.device, lambda: _all_reduces(tensor, burst))[0] / burst for _ in range(repeats)]


def _all_reduces(tensor: torch.Tensor, calls: int) -> None:
    for _ in range(calls):
        dist.all_reduce(tensor)


def _everyone(ok: bool, device: torch.device) -> bool:
    """True when `ok` holds on every rank (one all-reduce of a flag)."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def bench_rank(ctx: RankContext, config: Any) -> dict[str, Any]:
    """Run on every rank by the launcher; `config` is a `DDPBenchConfig`."""
    device = torch.device(ctx.device)
    if config.batch % ctx.world_size:
        raise ValueError(f"global batch {config.batch} is not divisible by {ctx.world_size} ranks")
    workload = Workload(batch=config.batch // ctx.world_size, seq=config.seq, precision=config.precision,
                        mode="train")
    # the point's memory first: the model, its data and one local forward and backward (no collective, so a rank
    # that runs out of memory cannot leave the others inside one); all ranks then agree whether to go on
    _everyone(True, device)  # the communicator exists before the model takes the memory (NCCL builds it lazily)
    failure = None
    try:
        step = transformer_step(config.model, workload, device=device, seed=config.seed + ctx.rank, lr=config.lr)
        plain_step_gradients(step)
        step.model.zero_grad(set_to_none=True)
    except Exception as error:  # noqa: BLE001 - anything but running out of memory is re-raised
        if not is_out_of_memory(error):
            raise
        failure = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        step = None  # what did fit goes back before the ranks agree
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not _everyone(failure is None, device):
        return {"rank": ctx.rank, "world_size": ctx.world_size, "device": device.type,
                "oom": failure or "out of memory on another rank"}
    wrappers = {label_of(variant, cap): build_variant(variant, cap, step.model, config.bucket_rule)
                for variant, cap in config.points()}
    trainable = [p for p in step.model.parameters() if p.requires_grad]
    element_size = trainable[0].element_size()
    memory = probe_memory(step, ctx.world_size, config.lr)
    errors, synced_grads_mib = check_variants(step, wrappers, ctx.world_size)
    step.optimizer = (ShardedOptimizer(step.model.parameters(), torch.optim.AdamW, lr=config.lr)
                      if config.shard_optimizer else torch.optim.AdamW(step.model.parameters(), lr=config.lr))
    steps = interleaved_steps(step, wrappers, config.warmup, config.iters)
    messages = {label: message_numels(wrapper, element_size) for label, wrapper in wrappers.items()}
    blocking = {label: label in BLOCKING for label in wrappers}
    comm = communication_alone(messages, blocking, trainable[0].dtype, device, 1, config.comm_iters)
    return {
        "rank": ctx.rank, "world_size": ctx.world_size, "threads": torch.get_num_threads(),
        "backend": ctx.backend, "device": device.type,
        "grad_bytes": sum(p.numel() * p.element_size() for p in trainable),
        "steps": steps, "comm": comm, "messages": messages, "errors": errors, "memory": memory,
        "comm_buffers_MiB": {label: comm_buffer_mib(wrapper) for label, wrapper in wrappers.items()},
        "synced_grads_MiB": synced_grads_mib,
        "allreduce": allreduce_sizes(trainable[0].dtype, device, config.comm_iters),
        "check_rtol": CHECK_RTOL,
    }
