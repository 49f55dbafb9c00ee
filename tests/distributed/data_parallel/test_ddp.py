"""DDP variants against single-process training, on real gloo process groups (2 and 3 spawned ranks).

One launch per world size runs its checks (spawning ranks costs seconds); each rank returns a list of failures
and the test asserts none. World 3 brings uneven ownership splits and a divisor that is not 2, and a model
with bf16 and fp32 parameters (buckets split by dtype). Tolerance: fp32 parameters after 5 SGD steps within
1e-5 relative (+1e-7 absolute) of single-process training on the full batch; bf16 gradients within 2 bf16
ulps (2**-7 relative) of the fp32 average; equality across ranks is exact.
"""

import copy
import time

import pytest

from stepscope.distributed.launch import LaunchConfig, launch
from stepscope.errors import DistributedError

RTOL, ATOL = 1e-5, 1e-7
WORLD = 2
LOCAL_BATCH = 3
STEPS = 5


# ---- models (built inside the ranks) -------------------------------------------------------------
def toy_model():
    import torch
    from torch import nn

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(6, 16)
            self.hidden = nn.Linear(16, 16)
            self.out = nn.Linear(16, 3)
            self.register_buffer("scale", torch.rand(16) + 0.5)  # rank-dependent until broadcast

        def forward(self, x, use_hidden=True):
            h = torch.relu(self.inp(x)) * self.scale
            if use_hidden:
                h = torch.tanh(self.hidden(h))
            return self.out(h)

    return Toy()


def tied_model():
    """A GPT-2-style TransformerLM: token embedding tied with the output projection, LayerNorms, biases."""
    from stepscope.nn import TransformerLM
    from stepscope.spec import get_preset

    return TransformerLM(get_preset("gpt2", vocab_size=97, context_length=16, d_model=32, n_layers=2,
                                    n_heads=2, d_ff=64))


def mixed_model():
    """The toy with its hidden layer in bf16: gradients of two dtypes, which never share a bucket."""
    import torch
    from torch import nn

    class Bf16(nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.linear = linear.to(torch.bfloat16)

        def forward(self, x):
            return self.linear(x.to(torch.bfloat16)).float()

    model = toy_model()
    model.hidden = Bf16(model.hidden)  # same place in the registration order
    return model


def frozen_model():
    model = toy_model()
    model.inp.bias.requires_grad_(False)  # frozen: never communicated, must stay equal (rank 0's)
    return model


def batch_for(name, step, ranks):
    """The global batch of a step (identical on every rank); `ranks` shards of LOCAL_BATCH rows."""
    import torch

    generator = torch.Generator().manual_seed(100 + step)
    rows = LOCAL_BATCH * ranks
    if name == "tied":
        tokens = torch.randint(0, 97, (rows, 9), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(rows, 6, generator=generator), torch.randn(rows, 3, generator=generator)


def loss_of(name, model, inputs, targets, use_hidden=True):
    import torch.nn.functional as F

    from stepscope.nn import lm_loss

    if name == "tied":
        return lm_loss(model(inputs), targets)
    return F.mse_loss(model(inputs, use_hidden=use_hidden), targets)


# ---- the ranks -------------------------------------------------------------------------------------
def flat_params(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [b.detach().reshape(-1) for b in model.buffers()])


def gathered(tensor):
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def recording_hook(state, bucket):
    """One hook for torch DDP and ours: checks the GradBucket API, averages AFTER the sum."""
    import torch.distributed as dist

    params, grads, buffer = bucket.parameters(), bucket.gradients(), bucket.buffer()
    state["calls"].append((bucket.index(), bool(bucket.is_last()), len(params),
                           [tuple(g.shape) for g in grads] == [tuple(p.shape) for p in params],
                           buffer.numel() == sum(p.numel() for p in params), buffer.dim() == 1))
    summed = buffer.clone()
    future = dist.all_reduce(summed, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0] / dist.get_world_size())


def make_wrapper(variant, module, hook_state):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from stepscope.distributed.data_parallel import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive

    if variant == "naive":
        return DDPNaive(module)
    if variant == "naive+hook":
        wrapper = DDPNaive(module)
        wrapper.register_comm_hook(hook_state, recording_hook)
        return wrapper
    if variant == "flat":
        return DDPFlat(module)
    if variant == "individual":
        return DDPIndividualParameters(module)
    if variant == "bucketed-one":
        return DDPBucketed(module, None)
    if variant == "bucketed-strict":
        return DDPBucketed(module, 0.002, rule="strict")  # 2 KiB: many buckets, big tensors alone
    if variant == "bucketed-torch+allreduce_hook":
        wrapper = DDPBucketed(module, 0.004, rule="torch")
        wrapper.register_comm_hook(None, allreduce_hook)  # PyTorch's own hook, unmodified
        return wrapper
    if variant == "bucketed+hook":
        wrapper = DDPBucketed(module, 0.004)
        wrapper.register_comm_hook(hook_state, recording_hook)
        return wrapper
    if variant == "torch+hook":
        wrapper = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=0.004)
        wrapper.register_comm_hook(hook_state, recording_hook)
        wrapper.finish_gradient_synchronization = lambda: None  # torch's reducer finishes inside backward
        return wrapper
    raise ValueError(variant)


VARIANTS = ["naive", "naive+hook", "flat", "individual", "bucketed-one", "bucketed-strict",
            "bucketed-torch+allreduce_hook", "bucketed+hook", "torch+hook"]
MODELS = {"toy": toy_model, "tied": tied_model, "frozen": frozen_model}


def check_training(ctx, name, variant, failures):
    """5 SGD steps of `variant` on this rank's shard vs single-process SGD on the full batch."""
    import torch

    torch.manual_seed(1000 + ctx.rank)  # ranks start from different weights and buffers
    module = MODELS[name]()
    before = flat_params(module)
    if all(torch.equal(before, other) for other in gathered(before)):
        failures.append(f"{name}/{variant}: ranks started equal, the broadcast check would prove nothing")
    hook_state = {"calls": []}
    model = make_wrapper(variant, module, hook_state)
    after = flat_params(module)
    if not all(torch.equal(after, other) for other in gathered(after)):
        failures.append(f"{name}/{variant}: ranks differ after construction (no broadcast of rank 0's state)")
    reference = copy.deepcopy(module)  # rank 0's initial weights, trained alone on the full batch
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    shard = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    for step in range(STEPS):
        inputs, targets = batch_for(name, step, ctx.world_size)
        optimizer.zero_grad(set_to_none=True)
        loss_of(name, model, inputs[shard], targets[shard]).backward()
        model.finish_gradient_synchronization()
        if name == "frozen" and module.inp.bias.grad is not None:
            failures.append(f"{name}/{variant}: the frozen parameter got a gradient")
        optimizer.step()
        reference_optimizer.zero_grad(set_to_none=True)
        loss_of(name, reference, inputs, targets).backward()
        reference_optimizer.step()
    trained, expected = flat_params(module), flat_params(reference)
    if not torch.allclose(trained, expected, rtol=RTOL, atol=ATOL):
        error = ((trained - expected).abs() / (expected.abs() + ATOL)).max().item()
        failures.append(f"{name}/{variant}: differs from single-process training (max rel error {error:.2e})")
    if not all(torch.equal(trained, other) for other in gathered(trained)):
        failures.append(f"{name}/{variant}: ranks diverged")
    if "hook" in variant and variant != "bucketed-torch+allreduce_hook":
        calls = hook_state["calls"]
        if not calls or not all(all(call[3:]) for call in calls):
            failures.append(f"{name}/{variant}: GradBucket API wrong: {calls[:3]}")
        steps, current = [], []
        for call in calls:  # a step ends at the bucket flagged is_last()
            current.append(call[0])
            if call[1]:
                steps.append(current)
                current = []
        if len(steps) != STEPS or current:
            failures.append(f"{name}/{variant}: is_last() flagged {len(steps)} times in {STEPS} steps")
        if any(indices != list(range(len(indices))) for indices in steps):
            failures.append(f"{name}/{variant}: bucket indices not 0..n-1 in launch order: {steps}")


def check_unused_parameters(ctx, failures):
    """A parameter unused on one rank only: bucketed/naive/flat treat it as a zero gradient there."""
    import torch

    for variant in ["naive", "flat", "bucketed-one", "bucketed-strict"]:
        torch.manual_seed(7)
        module = toy_model()
        model = make_wrapper(variant, module, {"calls": []})
        reference = copy.deepcopy(module)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        for step in range(3):
            inputs, targets = batch_for("toy", step, ctx.world_size)
            optimizer.zero_grad(set_to_none=True)
            shard = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
            loss_of("toy", model, inputs[shard], targets[shard], use_hidden=ctx.rank == 0).backward()
            model.finish_gradient_synchronization()
            optimizer.step()
            reference.zero_grad(set_to_none=True)
            total = sum(loss_of("toy", reference, inputs[r * LOCAL_BATCH:(r + 1) * LOCAL_BATCH],
                                targets[r * LOCAL_BATCH:(r + 1) * LOCAL_BATCH], use_hidden=r == 0)
                        for r in range(ctx.world_size))
            (total / ctx.world_size).backward()
            with torch.no_grad():
                for p in reference.parameters():
                    p -= 0.1 * p.grad
        if not torch.allclose(flat_params(module), flat_params(reference), rtol=RTOL, atol=ATOL):
            failures.append(f"unused/{variant}: differs from the reference with a rank-dependent unused layer")

    from stepscope.distributed.data_parallel import DDPIndividualParameters

    torch.manual_seed(7)
    model = DDPIndividualParameters(toy_model())
    inputs, targets = batch_for("toy", 0, ctx.world_size)
    loss_of("toy", model, inputs, targets, use_hidden=False).backward()  # unused on every rank alike
    try:
        model.finish_gradient_synchronization()
        failures.append("unused/individual: no error for a parameter without gradient")
    except RuntimeError as error:
        if "hidden.weight" not in str(error) or "DDPBucketed" not in str(error):
            failures.append(f"unused/individual: unclear error: {error}")
    import torch.distributed as dist

    dist.barrier()


def check_planner_matches_torch_ddp(ctx, failures):
    """The `torch` rule reproduces the bucket sizes PyTorch DDP itself reports after its rebuild."""
    import torch

    from stepscope.spec.buckets import plan_buckets

    for cap in (0.004, 0.02):
        torch.manual_seed(0)
        module = tied_model()
        ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=cap)
        for step in range(3):  # buckets are rebuilt at the 2nd step; logging reports them from the 3rd
            inputs, targets = batch_for("tied", step, 1)
            loss_of("tied", ddp, inputs, targets).backward()
        reported = [int(s) for s in ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")]
        planned = [bucket.nbytes for bucket in plan_buckets(module, cap, "torch")]
        if reported != planned:
            failures.append(f"planner at {cap} MiB: torch DDP used {reported} bytes, planner says {planned}")


def check_sharded_adamw(ctx, failures):
    """ShardedOptimizer(AdamW) is bit-identical to AdamW over 10 steps, with a group added at step 4, the
    learning rate halved through `param_groups` at step 5 (as a scheduler does) and a state_dict round trip at
    step 7; each parameter's state lives on exactly one rank."""
    import torch

    from stepscope.distributed.data_parallel import broadcast_module_state
    from stepscope.distributed.data_parallel.sharded_optimizer import ShardedOptimizer

    torch.manual_seed(ctx.rank)
    sharded_model = tied_model()
    broadcast_module_state(sharded_model)
    plain_model = copy.deepcopy(sharded_model)
    late = ["blocks.1.mlp.up.weight", "blocks.1.mlp.up.bias"]  # joins through add_param_group later

    def groups(model):
        early = [p for n, p in model.named_parameters() if n not in late]
        return [{"params": early}], {"params": [dict(model.named_parameters())[n] for n in late], "lr": 3e-3}

    options = dict(lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    first, added = groups(sharded_model)
    sharded = ShardedOptimizer(first, torch.optim.AdamW, **options)
    plain_first, plain_added = groups(plain_model)
    plain = torch.optim.AdamW(plain_first, **options)
    for step in range(10):
        if step == 4:
            sharded.add_param_group(added)
            plain.add_param_group(plain_added)
        if step == 5:
            for optimizer in (sharded, plain):
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5
        if step == 7:  # reload this rank's shard into a fresh sharded optimizer
            saved = sharded.state_dict()
            first, added = groups(sharded_model)
            sharded = ShardedOptimizer(first, torch.optim.AdamW, **options)
            sharded.add_param_group(added)
            sharded.load_state_dict(saved)
        inputs, targets = batch_for("tied", step, 2)  # the same data on every rank: gradients are equal
        sharded.zero_grad(set_to_none=True)
        loss_of("tied", sharded_model, inputs, targets).backward()
        for p_plain, p_sharded in zip(plain_model.parameters(), sharded_model.parameters(), strict=True):
            p_plain.grad = p_sharded.grad.clone()
        sharded.step()
        plain.step()
    for (name, a), b in zip(sharded_model.named_parameters(), plain_model.parameters(), strict=True):
        if not torch.equal(a, b):
            failures.append(f"sharded AdamW: {name} differs from AdamW (max {(a - b).abs().max().item():.2e})")
            break
    owned = torch.tensor([1.0 if p in sharded.state else 0.0 for p in sharded_model.parameters()])
    if not torch.equal(sum(gathered(owned)), torch.ones_like(owned)):
        failures.append("sharded AdamW: a parameter's state is held by no rank or by several")
    loads = sharded.owned_numel
    largest = max(p.numel() for p in sharded_model.parameters())
    if max(loads) - min(loads) > largest or min(loads) == 0 or len(loads) != ctx.world_size:
        failures.append(f"sharded AdamW: unbalanced ownership {loads}")
    if sum(loads) != sum(p.numel() for p in sharded_model.parameters()):
        failures.append(f"sharded AdamW: ownership {loads} does not cover every parameter once")
    sharded.zero_grad(set_to_none=True)
    if any(p.grad is not None for p in sharded_model.parameters()):
        failures.append("sharded AdamW: zero_grad missed parameters owned by other ranks")
    # broadcast off (a benchmark's compute-only rounds): only this rank's shard moves, and nothing is sent, so a
    # rank may even skip the step (fp16 loss scaling) without leaving the others inside a broadcast
    before = [p.detach().clone() for p in sharded_model.parameters()]
    sharded.broadcast = False
    for p in sharded_model.parameters():
        p.grad = torch.ones_like(p)
    if ctx.rank == 0:
        sharded.step()
    moved = [not torch.equal(a, b) for a, b in zip(before, sharded_model.parameters(), strict=True)]
    mine = [sharded.owner_of(p) == ctx.rank for p in sharded_model.parameters()]
    if moved != [ctx.rank == 0 and m for m in mine]:
        failures.append("sharded AdamW with broadcast off: parameters other than this rank's shard moved")


def check_gradient_accumulation(ctx, failures):
    """The one training step with 2 micro-batches under each wrapper (`no_sync` on the first): the averaged
    gradient of the whole local batch, reduced once per step."""
    import torch
    import torch.distributed as dist

    from stepscope.measure.training import TrainingStep
    from stepscope.spec import Workload

    workload = Workload(batch=2 * LOCAL_BATCH, seq=8, mode="fwd-bwd")
    for variant in ["naive", "flat", "individual", "bucketed-strict", "bucketed+hook", "torch+hook"]:
        torch.manual_seed(11)
        module = tied_model()
        reference = copy.deepcopy(module)
        inputs, targets = batch_for("tied", ctx.rank, 2)  # each rank its own 2 x LOCAL_BATCH rows
        hook_state = {"calls": []}
        step = TrainingStep(module, inputs, targets, workload, micro_batches=2)
        step.use(make_wrapper(variant, module, hook_state))
        step.run()
        got = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        loss_of("tied", reference, inputs, targets).backward()
        expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        dist.all_reduce(expected)
        expected /= ctx.world_size
        if not torch.allclose(got, expected, rtol=RTOL, atol=ATOL):
            failures.append(f"accumulation/{variant}: 2 micro-batches differ from the whole batch "
                            f"(max {(got - expected).abs().max().item():.2e})")
        if "hook" in variant and sum(call[1] for call in hook_state["calls"]) != 1:
            failures.append(f"accumulation/{variant}: gradients reduced {sum(c[1] for c in hook_state['calls'])} "
                            "times in one step of 2 micro-batches (no_sync should leave one)")


def check_mixed_dtypes(ctx, failures):
    """bf16 and fp32 gradients on a real process group: every wrapper's synchronized gradient is the average
    of the ranks' local gradients (fp32 ones to fp32 accuracy, bf16 ones to bf16's), the same on every rank."""
    import torch

    for variant in ["naive", "flat", "individual", "bucketed-strict", "torch+hook"]:
        torch.manual_seed(5)
        module = mixed_model()
        local = copy.deepcopy(module)
        model = make_wrapper(variant, module, {"calls": []})
        shard = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
        inputs, targets = batch_for("toy", 0, ctx.world_size)
        loss_of("toy", model, inputs[shard], targets[shard]).backward()
        model.finish_gradient_synchronization()
        loss_of("toy", local, inputs[shard], targets[shard]).backward()
        dtypes = set()
        for (name, got), mine in zip(module.named_parameters(), local.parameters(), strict=True):
            dtypes.add(got.dtype)
            expected = sum(g.float() for g in gathered(mine.grad)) / ctx.world_size
            exact = got.dtype == torch.float32
            rtol, atol = (RTOL, ATOL) if exact else (2.0**-7, 2.0**-7 * expected.abs().max().item())
            if got.grad.dtype != got.dtype or not torch.allclose(got.grad.float(), expected, rtol=rtol, atol=atol):
                failures.append(f"mixed/{variant}: {name} ({got.dtype}) gradient is not the ranks' average "
                                f"(max {(got.grad.float() - expected).abs().max().item():.2e})")
            elif not all(torch.equal(got.grad, other) for other in gathered(got.grad)):
                failures.append(f"mixed/{variant}: {name} gradient differs across ranks")
        if dtypes != {torch.float32, torch.bfloat16}:
            failures.append(f"mixed/{variant}: the model has parameters of {dtypes}, not bf16 and fp32")
        named = dict(module.named_parameters())
        for bucket in getattr(model, "plan", []):  # a bucket is one flat buffer: one dtype
            if {named[name].dtype for name in bucket.names} != {getattr(torch, bucket.dtype)}:
                failures.append(f"mixed/{variant}: bucket {bucket.index} mixes dtypes: {bucket.names}")
        buffers = model.communication_buffers() if hasattr(model, "communication_buffers") else []
        if buffers and {b.dtype for b in buffers} != dtypes:
            failures.append(f"mixed/{variant}: communication buffers of {[b.dtype for b in buffers]}")


def all_checks(ctx):
    import torch

    failures = []
    for name in MODELS:
        for variant in VARIANTS:
            check_training(ctx, name, variant, failures)
    check_unused_parameters(ctx, failures)
    check_planner_matches_torch_ddp(ctx, failures)
    check_sharded_adamw(ctx, failures)
    check_gradient_accumulation(ctx, failures)
    return {"failures": failures, "threads": torch.get_num_threads()}


def test_every_variant_matches_single_process_training_and_sharded_adamw_is_exact():
    results = launch(all_checks, config=LaunchConfig(world_size=WORLD, threads=1, timeout_s=60, deadline_s=240))
    failures = [f"rank {rank}: {failure}" for rank, result in enumerate(results) for failure in result["failures"]]
    assert not failures, "\n".join(failures)


def world_3_checks(ctx):
    """3 ranks: the variants with their own reduction code on the toy, one on the tied transformer, bf16 with
    fp32, sharded AdamW."""
    import torch

    failures = []
    for variant in ["naive+hook", "flat", "individual", "bucketed-strict", "bucketed+hook", "torch+hook"]:
        check_training(ctx, "toy", variant, failures)
    check_training(ctx, "tied", "bucketed-torch+allreduce_hook", failures)
    check_mixed_dtypes(ctx, failures)
    check_sharded_adamw(ctx, failures)
    return {"failures": failures, "threads": torch.get_num_threads()}


def test_three_ranks_mixed_dtypes_and_uneven_sharding():
    results = launch(world_3_checks, config=LaunchConfig(world_size=3, threads=1, timeout_s=60, deadline_s=240))
    failures = [f"rank {rank}: {failure}" for rank, result in enumerate(results) for failure in result["failures"]]
    assert not failures, "\n".join(failures)


# ---- failure mid-step ----------------------------------------------------------------------------
def raising_mid_step(ctx):
    import torch

    from stepscope.distributed.data_parallel import DDPBucketed

    torch.manual_seed(0)
    model = DDPBucketed(toy_model(), 0.002)
    inputs, targets = batch_for("toy", 0, 1)
    loss = loss_of("toy", model, inputs, targets)
    if ctx.rank == 1:
        raise RuntimeError("rank one fails between forward and backward")
    loss.backward()  # rank 0 launches buckets its peer never joins, then waits for them
    model.finish_gradient_synchronization()
    return "unreachable"


def test_a_rank_raising_mid_step_does_not_hang_the_run():
    start = time.monotonic()
    with pytest.raises(DistributedError) as failure:
        launch(raising_mid_step, config=LaunchConfig(world_size=WORLD, threads=1, timeout_s=30, teardown_s=2))
    assert time.monotonic() - start < 30
    assert failure.value.rank == 1 and "rank one fails between forward and backward" in str(failure.value)
