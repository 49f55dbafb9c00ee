"""The one training step every measurement runs: `step`, `profile`, `memory`, `ddp`, `innet train` and the
precision experiments all measure exactly this work.

- fwd: forward under `torch.no_grad()` (inference: no autograd graph is kept);
- fwd-bwd: forward and backward (gradients are dropped, untimed, before each iteration);
- train: forward, backward and an optimizer step (`zero_grad(set_to_none=True)` is part of the step).
bf16/fp16 use autocast on the model's fp32 weights; fp16 adds a GradScaler (loss scaling).

A data-parallel wrapper (`use(wrapper)`) takes the forward; its gradient synchronization
(`finish_gradient_synchronization()`, for stepscope's wrappers) ends backward. With `micro_batches` > 1 the
batch is split and gradients accumulate over the micro-batches, each loss scaled by 1/m so the gradient is
the whole batch's mean; every micro-batch but the last runs inside the wrapper's `no_sync()` when it has one
(PyTorch DDP and stepscope's wrappers), so gradients are reduced once per step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from stepscope.measure.device import autocast, synchronize
from stepscope.nn import AUX_LOSS_COEF, MOE_IMPLS, TransformerLM, lm_loss
from stepscope.spec import ModelSpec, Workload

LossFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
Optimizer = Literal["adamw", "sgd"]
OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


class TrainingStep:
    """A model, its optimizer and a fixed batch; `run()` does one step of `workload.mode`."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None, workload: Workload,
                 *, device: torch.device | str = "cpu", loss_fn: LossFn = lm_loss, compile: bool = False,
                 optimizer: Optimizer = "adamw", lr: float = 1e-4, micro_batches: int = 1) -> None:
        if micro_batches < 1 or inputs.shape[0] % micro_batches:
            raise ValueError(f"{micro_batches} micro-batches do not split a batch of {inputs.shape[0]}")
        self.workload, self.device = workload, torch.device(device)
        self.model = model.to(self.device)
        # torch.compile wraps the module; the first call compiles (see `compile_seconds`)
        self.compiled: nn.Module | None = torch.compile(self.model) if compile else None
        self.forward_module: nn.Module = self.model if self.compiled is None else self.compiled
        self.inputs = inputs.to(self.device)
        self.targets = targets.to(self.device) if targets is not None else None
        self.loss_fn, self.micro_batches = loss_fn, micro_batches
        # AdamW's fused implementation (one pass over each chunk of tensors), as training frameworks run it and as
        # the performance model times it: the default multi-tensor AdamW ran 3.3x as long on an H200
        # (docs/gpu-measurements.md), and on a CPU the default loop over tensors ran 5-7x as long on the 28M
        # parameters of a 32-expert MoE, whose stacked expert weights stream through memory once per elementwise
        # op (docs/moe.md)
        fused = {"fused": True} if optimizer == "adamw" and self.device.type in ("cuda", "cpu") else {}
        self.optimizer = (OPTIMIZERS[optimizer](self.model.parameters(), lr=lr, **fused)
                          if workload.mode == "train" else None)
        self.scaler = (torch.amp.GradScaler(self.device.type)
                       if workload.precision == "fp16" and workload.mode != "fwd" else None)
        self.loss: torch.Tensor | None = None

    def use(self, wrapper: nn.Module | None) -> None:
        """Run forward through `wrapper` (a data-parallel wrapper of `self.model`), or the bare model (None)."""
        if wrapper is None:
            wrapper = self.model if self.compiled is None else self.compiled
        self.forward_module = wrapper

    # ---- phases -------------------------------------------------------------------------------
    def forward(self, micro_batch: int | None = None) -> torch.Tensor:
        """The loss of the batch (or of one micro-batch, scaled by 1/micro_batches)."""
        inputs, targets = self._slice(micro_batch)
        grad = torch.no_grad() if self.workload.mode == "fwd" else contextlib.nullcontext()
        with grad, autocast(self.device, self.workload.precision):
            loss = self.loss_fn(self.forward_module(inputs), targets)
        self.loss = loss / self.micro_batches if micro_batch is not None and self.micro_batches > 1 else loss
        return self.loss

    def backward(self, *, synchronize_gradients: bool = True) -> None:
        """Backward of the last forward; then the wrapper's gradient synchronization, if it has one."""
        assert self.loss is not None, "forward() first"
        loss = self.scaler.scale(self.loss) if self.scaler is not None else self.loss
        loss.backward()
        self.loss = None  # let the graph's last references go
        finish = getattr(self.forward_module, "finish_gradient_synchronization", None)
        if synchronize_gradients and finish is not None:
            finish()

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
        runs inside `region(phase)` when given (profile and memory mark phases with profiler ranges).
        Micro-batches lap forward and backward once each, which the clock adds up per phase."""
        lap = lap or (lambda phase: None)
        region = region or (lambda phase: contextlib.nullcontext())
        for micro_batch in range(self.micro_batches):
            last = micro_batch == self.micro_batches - 1
            with self._accumulating(not last):
                with region("forward"):
                    self.forward(micro_batch if self.micro_batches > 1 else None)
                lap("forward")
                if self.workload.mode == "fwd":
                    continue
                with region("backward"):
                    self.backward(synchronize_gradients=last)
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

    # ---- helpers ------------------------------------------------------------------------------
    def _slice(self, micro_batch: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if micro_batch is None or self.micro_batches == 1:
            return self.inputs, self.targets
        size = self.inputs.shape[0] // self.micro_batches
        rows = slice(micro_batch * size, (micro_batch + 1) * size)
        return self.inputs[rows], (self.targets[rows] if self.targets is not None else None)

    def _accumulating(self, accumulate: bool) -> contextlib.AbstractContextManager:
        """The wrapper's `no_sync()` while gradients accumulate locally (not on the last micro-batch)."""
        no_sync = getattr(self.forward_module, "no_sync", None)
        return no_sync() if accumulate and no_sync is not None else contextlib.nullcontext()


def with_aux_loss(model: TransformerLM) -> LossFn:
    """The language-model loss plus AUX_LOSS_COEF x the MoE load-balancing loss of the same forward (MoE
    models; a dense model's loss is `lm_loss` itself)."""
    if not model.spec.is_moe:
        return lm_loss

    def loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        aux = model.aux_loss
        return lm_loss(logits, targets) + AUX_LOSS_COEF * aux if aux is not None else lm_loss(logits, targets)

    return loss


def transformer_step(spec: ModelSpec, workload: Workload, *, attention: str = "sdpa",
                     device: torch.device | str = "cpu", compile: bool = False, seed: int = 0,
                     data_seed: int | None = None, optimizer: Optimizer = "adamw", lr: float = 1e-4,
                     micro_batches: int = 1, moe_impl: str = MOE_IMPLS[0]) -> TrainingStep:
    """The training step of `TransformerLM(spec)`: weights seeded with `seed` (the caller's CPU random state
    is left as it was), a random batch of tokens drawn with `data_seed` (default `seed`); an MoE model's
    experts run `moe_impl` and its loss includes the load-balancing loss (`with_aux_loss`)."""
    generator = torch.Generator().manual_seed(seed if data_seed is None else data_seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerLM(spec, attention=attention, moe_impl=moe_impl)  # initialized on the CPU, then moved
    data = torch.randint(0, spec.vocab_size, (workload.batch, workload.seq + 1), generator=generator)
    return TrainingStep(model, data[:, :-1], data[:, 1:], workload, device=device, compile=compile,
                        optimizer=optimizer, lr=lr, micro_batches=micro_batches, loss_fn=with_aux_loss(model))
