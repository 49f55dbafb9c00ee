"""One training step split into phases (forward, backward, optimizer), shared by `step`, `profile`
and `memory` so every command measures exactly the same work.

- fwd: forward under `torch.no_grad()` (inference: no autograd graph is kept);
- fwd-bwd: forward and backward (gradients are dropped, untimed, before each iteration);
- train: forward, backward and an AdamW step (`zero_grad(set_to_none=True)` is part of the step).
bf16/fp16 use autocast on the model's fp32 weights; fp16 adds a GradScaler (loss scaling).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from stepscope.measure.device import autocast, synchronize
from stepscope.nn import TransformerLM, lm_loss
from stepscope.spec import ModelSpec, Workload


class TrainingStep:
    """A model, an optimizer and a fixed random batch; `run()` does one step of `workload.mode`."""

    def __init__(self, spec: ModelSpec, workload: Workload, *, attention: str = "sdpa",
                 device: torch.device | str = "cpu", compile: bool = False, seed: int = 0,
                 lr: float = 1e-4) -> None:
        self.spec, self.workload, self.device = spec, workload, torch.device(device)
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):  # seeded weights; the caller's CPU RNG state is left as it was
            torch.manual_seed(seed)
            model = TransformerLM(spec, attention=attention)  # initialized on the CPU, then moved
        model = model.to(self.device)
        self.model = model
        # torch.compile wraps the module; the first call compiles (see `compile_seconds`)
        self.forward_module: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compile else model
        data = torch.randint(0, spec.vocab_size, (workload.batch, workload.seq + 1), generator=generator)
        self.tokens = data[:, :-1].to(self.device)
        self.targets = data[:, 1:].to(self.device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr) if workload.mode == "train" else None
        self.scaler = (torch.amp.GradScaler(self.device.type)
                       if workload.precision == "fp16" and workload.mode != "fwd" else None)
        self.loss: torch.Tensor | None = None

    # ---- phases -------------------------------------------------------------------------------
    def forward(self) -> torch.Tensor:
        grad = torch.no_grad() if self.workload.mode == "fwd" else contextlib.nullcontext()
        with grad, autocast(self.device, self.workload.precision):
            self.loss = lm_loss(self.forward_module(self.tokens), self.targets)
        return self.loss

    def backward(self) -> None:
        assert self.loss is not None, "forward() first"
        loss = self.scaler.scale(self.loss) if self.scaler is not None else self.loss
        loss.backward()
        self.loss = None  # let the graph's last references go

    def optimizer_step(self) -> None:
        assert self.optimizer is not None, "optimizer_step() needs mode train"
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def prepare(self) -> None:
        """Untimed work before an iteration: fwd-bwd drops the previous gradients (no accumulation)."""
        if self.workload.mode == "fwd-bwd":
            self.model.zero_grad(set_to_none=True)

    def run(self, lap: Callable[[str], None] | None = None,
            region: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
        """One step of the workload's mode; `lap(phase)` is called at the end of each phase, and each phase
        runs inside `region(phase)` when given (profile and memory mark phases with profiler ranges)."""
        lap = lap or (lambda phase: None)
        region = region or (lambda phase: contextlib.nullcontext())
        with region("forward"):
            self.forward()
        lap("forward")
        if self.workload.mode == "fwd":
            return
        with region("backward"):
            self.backward()
        lap("backward")
        if self.workload.mode == "train":
            with region("optimizer"):
                self.optimizer_step()
            lap("optimizer")

    def compile_seconds(self) -> float:
        """Run the first step (which compiles) and return its wall time."""
        synchronize(self.device)
        start = time.perf_counter()
        self.prepare()
        self.run()
        synchronize(self.device)
        return time.perf_counter() - start
