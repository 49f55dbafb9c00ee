"""Two classic mixed-precision experiments.

- `accumulate`: add 0.01 a thousand times (exact answer 10) in fp32, fp16, bf16 and mixed
  accumulators: shows why accumulators stay in fp32.
- `autocast_dtypes`: one forward and backward of the training step under autocast; for each module the
  dtype of its parameters, outputs and gradients, and the loss dtype: shows what autocast really runs in low
  precision (`model_dtypes` runs it on the textbook toy model or on a TransformerLM).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stepscope.errors import UsageError
from stepscope.measure.device import dtype_of
from stepscope.measure.environment import torch_environment
from stepscope.measure.precision.config import AccumulateConfig, DtypesConfig
from stepscope.measure.training import TrainingStep, transformer_step
from stepscope.results.store import RecordStore, make_record
from stepscope.spec import ModelSpec, Workload

MAX_ACCUMULATE_STEPS = 10_000_000
"""Each step is a Python-level add (about a microsecond): beyond this the experiment runs for minutes."""


def accumulate(steps: int, increment: float) -> list[dict[str, Any]]:
    """Sum `increment` `steps` times with different accumulator / increment dtypes."""
    if not 0 < steps <= MAX_ACCUMULATE_STEPS or not math.isfinite(increment) or increment == 0:
        raise UsageError(f"need 0 < steps <= {MAX_ACCUMULATE_STEPS:,} and a finite, non-zero increment, got "
                         f"steps={steps} increment={increment}")
    exact = steps * increment
    if not math.isfinite(exact):
        raise UsageError(f"steps x increment = {exact} overflows: give a smaller increment or fewer steps")
    cases = [
        ("fp32 += fp32", torch.float32, torch.float32, False),
        ("fp16 += fp16", torch.float16, torch.float16, False),
        ("bf16 += bf16", torch.bfloat16, torch.bfloat16, False),
        ("fp32 += fp16", torch.float32, torch.float16, False),
        ("fp32 += fp16 cast to fp32", torch.float32, torch.float16, True),
    ]
    rows = []
    for name, accumulator_dtype, increment_dtype, cast in cases:
        total = torch.tensor(0.0, dtype=accumulator_dtype)
        step = torch.tensor(increment, dtype=increment_dtype)
        if cast:
            step = step.to(torch.float32)
        for _ in range(steps):
            total += step
        value = float(total)
        rows.append({"case": name, "value": value, "abs_error": abs(value - exact),
                     "rel_error": abs(value - exact) / abs(exact)})
    return rows


class ToyModel(nn.Module):
    """Linear -> ReLU -> LayerNorm -> Linear: the textbook autocast example."""

    def __init__(self, in_features: int = 16, hidden: int = 32, out_features: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.relu = nn.ReLU()
        self.ln = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def _dtype_name(value: Any) -> str | None:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return _dtype_name(value[0])
    return None


def autocast_dtypes(step: TrainingStep) -> tuple[list[dict[str, Any]], str]:
    """One forward and backward of the training step under its autocast; per module (in call order) the
    dtypes of its parameters, outputs and gradients, and the loss dtype."""
    model = step.model
    outputs: dict[str, str | None] = {}
    order: list[str] = []
    names = {module: name or "(model)" for name, module in model.named_modules()}

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        name = names[module]
        if name not in outputs:
            order.append(name)
        outputs[name] = _dtype_name(output)

    handles = [module.register_forward_hook(hook) for module in model.modules()]
    try:
        loss_dtype = _dtype_name(step.forward())
        step.backward()
    finally:
        for handle in handles:
            handle.remove()
    rows = []
    modules = dict(model.named_modules())
    for name in order:
        module = modules["" if name == "(model)" else name]
        params = list(module.parameters(recurse=False)) or (list(module.parameters()) if name == "(model)" else [])
        grads = [p.grad for p in params if p.grad is not None]
        rows.append({"module": name, "type": type(module).__name__,
                     "param_dtype": _dtype_name(params[0]) if params else "-",
                     "output_dtype": outputs[name] or "-",
                     "grad_dtype": _dtype_name(grads[0]) if grads else "-"})
    return rows, loss_dtype or "-"


def model_dtypes(spec: ModelSpec | None, device: torch.device, precision: str
                 ) -> tuple[list[dict[str, Any]], str]:
    """`autocast_dtypes` of the toy model (spec None) on a random (8, 16) input, or of a `TransformerLM(spec)`
    on a tiny random batch."""
    dtype_of(precision)
    if spec is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, inputs = ToyModel(), torch.randn(8, 16)
        workload = Workload(batch=8, seq=16, precision=precision, mode="fwd-bwd")
        step = TrainingStep(model, inputs, None, workload, device=device,
                            loss_fn=lambda out, _: out.float().pow(2).mean())
    else:
        workload = Workload(batch=2, seq=min(16, spec.context_length), precision=precision, mode="fwd-bwd")
        step = transformer_step(spec, workload, device=device)
    return autocast_dtypes(step)


def run_accumulate(config: AccumulateConfig, out: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """`accumulate`, one `precision` record per case in `<out>/precision.jsonl` (None: not stored); its rows."""
    rows = accumulate(config.steps, config.increment)  # microseconds of work; validates the settings first
    if out is not None:
        store = RecordStore(out, "precision").check_writable()
        env = torch_environment("cpu")
        for row in rows:
            store.append(make_record("precision", {"experiment": "accumulate", "case": row["case"],
                                                   "steps": config.steps, "increment": config.increment},
                                     {k: row[k] for k in ("value", "abs_error", "rel_error")}, env=env))
    return rows


@dataclass
class DtypesResult:
    """What autocast ran in: per module (in call order) parameter, output and gradient dtypes; the loss dtype."""

    modules: list[dict[str, Any]]
    loss_dtype: str
    device: str


def run_dtypes(config: DtypesConfig, out: str | os.PathLike | None = None) -> DtypesResult:
    """`model_dtypes` on the configured device, one `precision` record in `<out>/precision.jsonl` (None: not
    stored)."""
    from stepscope.measure.device import check_precision, resolve_device

    device = resolve_device(config.device)
    check_precision(device, config.precision)
    record_config: dict[str, Any] = {"experiment": "dtypes", "model": config.model_name, "precision": config.precision,
                                     "device": device.type}
    if config.model is not None:
        record_config["model_spec"] = config.model.to_dict()
    store = RecordStore(out, "precision").check_writable() if out is not None else None
    rows, loss_dtype = model_dtypes(config.model, device, config.precision)
    if store is not None:
        store.append(make_record("precision", record_config, {"modules": rows, "loss_dtype": loss_dtype},
                                 env=torch_environment(device)))
    return DtypesResult(rows, loss_dtype, device.type)
