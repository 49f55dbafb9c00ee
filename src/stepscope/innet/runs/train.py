"""`stepscope innet train`: data-parallel training whose gradient buckets are averaged by the switch.

Each rank trains the same model with DDP, first with gloo's all-reduce (the baseline), then with the
innet hook, for K = world (no straggler tolerance) and K < world, each without and with an injected
straggler (a rank sleeping before its backward). Ranks do not synchronize between steps, so with
K < world the fast ranks really do move on without the straggler. A step's time is taken on the fastest
K ranks (K-th fastest; K = world: the slowest rank); the straggler's own step time is reported apart.
At the end of each backend every rank's parameters are hashed: replicas must be identical.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.innet.runs.runner import RunOutcome, run_ranks, start_run
from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.job import SwitchJob
from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.client import InnetJob
from stepscope.innet.worker.config import JobConfig, shared_job_id
from stepscope.innet.worker.faults import StragglerSpec
from stepscope.results.store import RecordStore, make_record
from stepscope.spec import ModelSpec, Workload, get_preset

DDP_KINDS = ("torch", "bucketed")


@dataclass(frozen=True)
class TrainConfig:
    """One `innet train` run."""

    model: ModelSpec = field(default_factory=lambda: get_preset("gpt2"))
    """The model (`innet train` shortens it to one layer on CPU unless --n-layers is given)."""
    world: int = 4
    """Ranks."""
    batch: int = 1
    """Sequences per rank and step."""
    seq: int = 32
    """Tokens per sequence."""
    steps: int = 2
    """Timed steps per scenario."""
    warmup: int = 1
    """Untimed steps per scenario (DDP builds its buckets in the first)."""
    ks: tuple[int, ...] | None = None
    """Fastest-K values to run (world = no straggler tolerance); None = world and world - 1."""
    straggler: StragglerSpec = field(default_factory=lambda: StragglerSpec(ranks=(-1,), delay_s=2.0))
    """The straggler injected in the `straggler` scenarios (steps count timed steps from 0; rank -1: the last)."""
    gloo: bool = True
    """Also run the gloo baseline."""
    ddp: str = "torch"
    """torch (torch.nn.parallel.DistributedDataParallel) or bucketed (stepscope's DDPBucketed)."""
    bucket_MiB: float = 25.0
    """Gradient bucket cap (MiB)."""
    lr: float = 1e-3
    """SGD learning rate."""
    seed: int = 0
    """Seed of weights and data."""
    job: JobConfig = field(default_factory=lambda: JobConfig(values_per_packet=p.MAX_VALUES))
    """Packet settings (the switch, rank, world and job id set per run); a whole datagram per packet, as
    Python's cost per packet would otherwise dominate the steps of a real model's buckets."""

    def resolved(self) -> TrainConfig:
        """The values that follow the world filled in: fastest-K (world, world - 1), the straggler's rank -1."""
        ks = self.ks if self.ks is not None else tuple(sorted({self.world, max(1, self.world - 1)}, reverse=True))
        return replace(self, ks=ks, straggler=self.straggler.for_world(self.world))

    def validate(self) -> None:
        config = self.resolved()
        if config.world < 2:
            raise UsageError("--world must be at least 2")
        if any(not 1 <= k <= config.world for k in config.ks or ()):
            raise UsageError(f"-k values must be 1..world ({config.world})")
        if config.steps < 1 or config.warmup < 1 or config.batch < 1 or config.seq < 1:
            raise UsageError("--steps, --warmup, --batch and --seq must be >= 1")
        if config.seq > config.model.context_length:
            raise UsageError(f"--seq {config.seq} exceeds the model's context length {config.model.context_length}")
        if config.ddp not in DDP_KINDS:
            raise UsageError(f"--ddp must be {' or '.join(DDP_KINDS)}")
        config.straggler.validate(config.world)
        replace(config.job, rank=0, world=config.world).validate()

    def scenarios(self) -> list[tuple[str, int, bool]]:
        """(backend, K, straggler) in run order."""
        out = [("gloo", self.world, s) for s in (False, True)] if self.gloo else []
        return out + [("innet", k, s) for k in self.resolved().ks or () for s in (False, True)]

    def record_config(self, switch: str | None) -> dict[str, Any]:
        """The run's configuration as its records hold it: the job as given, at the run's world and with the
        switch named (else the job's own address: a started switch's port is the OS's pick of the moment)."""
        config = self.resolved()
        job = replace(config.job, world=config.world, switch=switch or config.job.switch)
        return {**asdict(replace(config, job=job)), "model": config.model.name}


def train_rank(ctx: Any, config: TrainConfig, out_dir: str | None = None,
               settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """One rank: every scenario's step times, the bucket log lines (rank 0) and a parameter hash. Rank 0 appends
    each scenario's record to `<out_dir>/innet-train.jsonl` as soon as it is done (Ctrl-C keeps those)."""
    import torch.distributed as dist

    from stepscope.innet.worker.ddp_hook import InnetHookState, innet_hook
    from stepscope.measure.environment import torch_environment
    from stepscope.measure.training import transformer_step

    store = RecordStore(out_dir, "innet-train") if out_dir is not None and ctx.rank == 0 else None
    env = torch_environment("cpu", ctx.world_size) if store is not None else {}
    all_scenarios = config.scenarios()

    workload = Workload(batch=config.batch, seq=config.seq, precision="fp32", mode="train")
    rng = random.Random(config.seed * 7919 + ctx.rank)
    job_id = shared_job_id()  # drawn on rank 0: under torchrun every rank runs `run_train` itself
    out: dict[str, Any] = {"rank": ctx.rank, "scenarios": [], "log": [], "hash": {}, "buckets": []}
    for backend in ("gloo", "innet"):
        scenarios = [s for s in config.scenarios() if s[0] == backend]
        if not scenarios:
            continue
        # the same weights on every rank and for both backends; each rank its own data
        step = transformer_step(config.model, workload, seed=config.seed, data_seed=config.seed * 1000 + ctx.rank,
                                optimizer="sgd", lr=config.lr)
        step.use(_wrap(step.model, config))
        job, state = None, None
        if backend == "innet":
            lines: list[str] = []
            job = InnetJob(replace(config.job, rank=ctx.rank, world=ctx.world_size, job_id=job_id),
                           log=lines.append).join()
            state = InnetHookState(job)
            step.forward_module.register_comm_hook(state, innet_hook)
        try:
            for _, k, straggle in scenarios:
                if state is not None:
                    state.k = None if k >= ctx.world_size else k
                    lines.clear()
                    state.ops.clear()
                dist.barrier()
                times = []
                for index in range(config.warmup + config.steps):
                    timed = index >= config.warmup
                    start = time.perf_counter()
                    loss = step.forward()
                    if straggle and timed:
                        time.sleep(config.straggler.delay_for(ctx.rank, index - config.warmup, rng))  # backward late
                    step.backward()  # and the DDP wrapper's gradient synchronization
                    step.optimizer_step()
                    if timed:
                        times.append(time.perf_counter() - start)
                    if state is not None and index == 0 and ctx.rank == 0:
                        out["log"].append(list(lines))
                        out["buckets"] = [o["values"] for o in state.ops]
                summary = {"backend": backend, "k": k, "straggler": straggle, "times": times,
                           "loss": float(loss.detach())}
                if state is not None:
                    summary["timed_out_blocks"] = sum(o["timed_out_blocks"] for o in state.ops)
                    summary["clipped_blocks"] = sum(o["clipped_blocks"] for o in state.ops)
                    summary["min_contributors"] = min((o["min_contributors"] for o in state.ops), default=k)
                out["scenarios"].append(summary)
                everyone: list[Any] = [None] * ctx.world_size
                dist.all_gather_object(everyone, summary)
                if store is not None:
                    index = len(out["scenarios"]) - 1
                    row = scenario_row(config, all_scenarios[index], everyone)
                    scenario = {"backend": row["backend"], "k": row["k"], "straggler": row["straggler"]}
                    store.append(make_record("innet-train", {**(settings or {}), **scenario},
                                             {name: v for name, v in row.items() if name not in scenario}, env=env))
            dist.barrier()
            out["hash"][backend] = _parameter_hash(step.model)
        finally:
            if job is not None:
                job.close()
        del step
    return out


def _wrap(model: Any, config: TrainConfig) -> Any:
    if config.ddp == "bucketed":
        from stepscope.distributed.data_parallel import DDPBucketed

        return DDPBucketed(model, bucket_size_mb=config.bucket_MiB, rule="torch")
    from stepscope.distributed.data_parallel.torch_ddp import torch_ddp

    return torch_ddp(model, config.bucket_MiB)  # no buffer sync in forward: fast ranks never wait for the straggler


def _parameter_hash(model: Any) -> str:
    digest = hashlib.sha1()
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def summarize(config: TrainConfig, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario from every rank's step times."""
    return [scenario_row(config, scenario, [r["scenarios"][index] for r in results])
            for index, scenario in enumerate(config.scenarios())]


def scenario_row(config: TrainConfig, scenario: tuple[str, int, bool], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's row from every rank's summary of it (rank order)."""
    backend, k, straggle = scenario
    stragglers = set(config.straggler.ranks)
    per_rank = np.array([r["times"] for r in ranks])  # ranks x steps
    kth = np.sort(per_rank, axis=0)[k - 1]
    fast = [r for r in range(config.world) if r not in stragglers]
    row = {"backend": backend, "k": k, "tolerance": "no-straggle" if k >= config.world else f"straggle-{k}",
           "straggler": config.straggler.describe() if straggle else "none",
           "step_ms_median": float(np.median(kth)) * 1e3,
           "fast_ranks_step_ms_median": float(np.median(per_rank[fast])) * 1e3,
           "straggler_step_ms_median": (float(np.median(per_rank[sorted(stragglers)])) * 1e3
                                        if stragglers else None),
           "loss": ranks[0]["loss"]}
    if backend == "innet":
        row["timed_out_blocks"] = ranks[0]["timed_out_blocks"]
        row["min_contributors"] = min(r["min_contributors"] for r in ranks)
        # blocks a rank sent clipped to an exponent agreed without it (late after a timeout): not exact
        row["clipped_blocks"] = sum(r["clipped_blocks"] for r in ranks)
    return row


MAX_HISTORY = 2**20
"""The most results a switch keeps per job (`protocol.JoinParams.problem`)."""


@dataclass
class TrainOutcome(RunOutcome[TrainConfig]):
    """`run_train`'s outcome: the config as run (world and its defaults resolved), a row per scenario, rank 0's
    bucket log lines (first step of each innet scenario), its bucket sizes, and whether replicas agree."""

    log: list[list[str]] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    replicas_identical: dict[str, bool] = field(default_factory=dict)


def run_train(config: TrainConfig, out: str | os.PathLike | None = None, *,
              switch: str | None = None) -> TrainOutcome | None:
    """Train every scenario on `config.world` launched ranks (under torchrun/Slurm: theirs) against the running
    switch at `switch` (None: a switch process started for the run; required under torchrun/Slurm), then
    append one `innet-train` record per scenario to `<out>/innet-train.jsonl` (None: none). Rank 0's outcome;
    None on the other ranks under torchrun/Slurm."""

    config, store = start_run(config, out, switch, "innet-train")
    config = config.resolved()
    settings = config.record_config(switch)
    # A rank that falls behind (the straggler with K < world) recovers results it missed from the switch's
    # history: keep a whole step of blocks there, and let the late rank stash a step of early results.
    blocks_per_step = -(-config.model.param_count() // config.job.k) + config.job.slots
    job = replace(config.job, history=min(max(config.job.history, blocks_per_step), MAX_HISTORY),
                  stash_limit_bytes=max(config.job.stash_limit_bytes, 3 * 4 * config.model.param_count()))
    # the switch keeps that history: a switch started for the run allows the job what it needs (one named by
    # --switch needs --max-job-MiB that large; it refuses the job otherwise)
    need_MiB = -(-SwitchJob.memory_bytes(config.world, job.join_params()) // 2**20)
    results = run_ranks(train_rank, replace(config, job=job), None if store is None else str(out), settings,
                        out=out, switch=switch, timeout_s=300,
                        job_MiB=need_MiB if need_MiB > SwitchConfig().max_job_bytes >> 20 else None)
    if results is None:
        return None
    hashes = {backend: {r["hash"].get(backend) for r in results} for backend in ("gloo", "innet")}
    outcome = TrainOutcome(config, summarize(config, results), None if store is None else store.path,
                           log=results[0]["log"], buckets=results[0]["buckets"],
                           replicas_identical={b: len(h) == 1 for b, h in hashes.items() if None not in h})
    return outcome  # the records: rank 0 appended each scenario's as it finished
