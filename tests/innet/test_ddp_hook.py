"""The DDP hook trains like gloo DDP: 3 real spawned ranks (an average that is not a halving), a real switch
process, torch DDP and DDPBucketed."""


from stepscope.distributed.launch.launcher import LaunchConfig, launch
from stepscope.innet.switch.process import SwitchProcess

STEPS = 3


def _train(wrapper, model, tokens, targets):
    import torch

    from stepscope.nn import lm_loss

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        lm_loss(wrapper(tokens), targets).backward()
        if hasattr(wrapper, "finish_gradient_synchronization"):
            wrapper.finish_gradient_synchronization()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def ddp_rank(ctx, switch_address, job_ids):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.distributed.data_parallel import DDPBucketed
    from stepscope.innet.worker.client import InnetJob
    from stepscope.innet.worker.config import JobConfig
    from stepscope.innet.worker.ddp_hook import InnetHookState, innet_hook
    from stepscope.nn import TransformerLM
    from stepscope.spec import get_preset

    spec = get_preset("tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=64)
    data = torch.randint(0, spec.vocab_size, (2, 17), generator=torch.Generator().manual_seed(ctx.rank))
    tokens, targets = data[:, :-1], data[:, 1:]

    def fresh():
        torch.manual_seed(0)
        return TransformerLM(spec)

    initial = [p.detach().clone() for p in fresh().parameters()]
    model = fresh()
    reference = _train(DistributedDataParallel(model), model, tokens, targets)
    out = {"moved": max(float((a - b).abs().max()) for a, b in zip(reference, initial, strict=True))}
    for name, job_id in zip(("torch", "bucketed"), job_ids, strict=True):
        lines = []
        job = InnetJob(JobConfig(switch=switch_address, job_id=job_id, rank=ctx.rank, world=ctx.world_size,
                                 pipes=1, slots=16, timeout_s=20), log=lines.append).join()
        model = fresh()
        wrapper = (DistributedDataParallel(model, bucket_cap_mb=0.01) if name == "torch"
                   else DDPBucketed(model, bucket_size_mb=0.01))
        wrapper.register_comm_hook(InnetHookState(job), innet_hook)
        trained = _train(wrapper, model, tokens, targets)
        job.close()
        out[name] = max(float((a - b).abs().max()) for a, b in zip(trained, reference, strict=True))
        out[f"{name}_ops"] = len(lines)
        out[f"{name}_line"] = lines[-1]
        if name == "bucketed":
            out["bucket_numels"] = wrapper.message_numels()
            last_step = lines[-len(wrapper.message_numels()):]
            out["logged_numels"] = [int(line.split("[")[1].split(" ")[0]) for line in last_step]
    return out


def test_innet_hook_trains_to_the_same_parameters_as_gloo_ddp():
    with SwitchProcess() as switch:
        results = launch(ddp_rank, switch.address, (301, 302),
                         config=LaunchConfig(world_size=3, threads=1, timeout_s=60, deadline_s=180))
        output = switch.stop()
    for result in results:
        assert result["moved"] > 1e-3  # training really changed the weights
        assert result["torch"] < 1e-5 and result["bucketed"] < 1e-5  # within quantization error of gloo DDP
        assert result["torch_ops"] >= 2 * STEPS and result["bucketed_ops"] >= 2 * STEPS  # several buckets per step
        assert result["logged_numels"] == result["bucket_numels"]  # one log line per real bucket
        assert result["bucketed_line"].endswith("1-pipe average quant.1 no-straggle")
    assert "innet switch" in output and "301" in output and "302" in output  # the process served both jobs
