"""The MoE block, its pieces and the dense MLP of equal activated FLOPs as candidates of one interleaved run.

Each candidate runs its forward (under the step's autocast) and, unless the mode is fwd, its backward with
fixed random output gradients, lapping `forward` and `backward`; before each run (untimed) the gradients of
its inputs and parameters are dropped, as a step's `zero_grad(set_to_none=True)` does. The pieces call the
grouped fast path's own functions (`nn.moe_dispatch`, `RoutedExperts.grouped_rows`) on inputs taken from one
forward of the block and detached, so a piece's time is its own forward and backward:
- router: scores, top-k, weights, the sort by expert and the load-balancing loss;
- permute: the dispatch indices, the token rows gathered in expert order, each row's combine weight;
- experts: both expert GEMMs over all experts with the weighted activation between them (`nn.moe_gemm`);
- combine: each token's rows put back and summed;
- shared: the shared experts (models that have them).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from stepscope.measure.device import autocast, dtype_of
from stepscope.nn import AUX_LOSS_COEF
from stepscope.nn.moe import MoE
from stepscope.nn.moe_dispatch import Dispatch, combine, permute
from stepscope.nn.moe_gemm import gemm_kind
from stepscope.nn.transformer import MLP
from stepscope.spec import ModelSpec

Lap = Callable[[str], None]


@dataclass
class Candidate:
    """One timed candidate: `run(lap)` does its forward (and backward); `leaves` lose their gradients first."""

    forward: Callable[[], Sequence[torch.Tensor]]
    grads: list[torch.Tensor | None]
    leaves: list[torch.Tensor]
    backward: bool

    def prepare(self) -> None:
        for leaf in self.leaves:
            leaf.grad = None

    def run(self, lap: Lap, autocast_context: Callable[[], object]) -> None:
        with autocast_context():
            outputs = self.forward()
        lap("forward")
        if self.backward:
            torch.autograd.backward(list(outputs), self.grads)
            lap("backward")


@dataclass
class BlockBench:
    """The candidates of the block (`moe block`, `reference block`, `dense mlp`, then the pieces) and what they
    ran on."""

    candidates: dict[str, Candidate]
    block: MoE
    reference: MoE
    x: torch.Tensor
    gemm_kind: str
    """How the experts' GEMMs ran on these tokens: `grouped_mm` or a padded `bmm`, or `auto -> ` the one chosen
    (`nn.moe_gemm`)."""


def _output_grads(outputs: Sequence[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor | None]:
    """A fixed random gradient per output (1 for the scalar load-balancing loss, already scaled)."""
    return [torch.ones_like(o) if o.dim() == 0 else
            torch.randn(o.shape, generator=generator).to(device=o.device, dtype=o.dtype) for o in outputs]


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def build_block_bench(spec: ModelSpec, dense_spec: ModelSpec, tokens: int, device: torch.device, precision: str,
                      backward: bool, seed: int, compile: bool = False) -> BlockBench:
    """The MoE block of `spec` (seeded like a model's), its reference twin, the dense MLP of `dense_spec` and the
    pieces, on `tokens` random tokens."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = MoE(spec, "grouped", shared=MLP).to(device)
        dense = MLP(dense_spec).to(device)
    reference = copy.deepcopy(block)
    reference.experts.impl = "reference"
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, spec.d_model, generator=generator).to(device).requires_grad_()
    dtype = dtype_of(precision)
    experts = block.experts
    kind = gemm_kind(device, dtype, (experts.w_up.shape[1], experts.w_up.shape[2], experts.w_down.shape[1]))
    with torch.no_grad(), autocast(device, precision):
        routing = block.router(x)
        dispatch = Dispatch.of(routing, kind)
        rows = permute(x.to(dtype), dispatch)
        row_weights = dispatch.row_weights(routing)
        y = experts.grouped_rows(rows, row_weights, dispatch.layout)
    weights, x_rows, rows, row_weights, y = (_leaf(t) for t in (routing.weights, x.to(dtype), rows, row_weights, y))

    def run_block(module: MoE) -> Callable[[], Sequence[torch.Tensor]]:
        def forward() -> Sequence[torch.Tensor]:
            out = module(x)
            return out, module.aux_loss * AUX_LOSS_COEF
        return forward

    def router() -> Sequence[torch.Tensor]:
        r = block.router(x)
        return r.weights, r.aux_loss * AUX_LOSS_COEF

    def permute_piece() -> Sequence[torch.Tensor]:  # the dispatch's indices (and the bmm's host sync) included
        piece_routing = dataclasses.replace(routing, weights=weights)
        piece_dispatch = Dispatch.of(piece_routing, kind)
        return permute(x_rows, piece_dispatch), piece_dispatch.row_weights(piece_routing)

    def expert_gemms() -> Sequence[torch.Tensor]:
        return (experts.grouped_rows(rows, row_weights, dispatch.layout),)

    def shared() -> Sequence[torch.Tensor]:
        out = block.shared[0](x)
        for expert in block.shared[1:]:
            out = out + expert(x)
        return (out,)

    expert_params = list(experts.parameters())
    forwards: dict[str, tuple[Callable[[], Sequence[torch.Tensor]], list[torch.Tensor]]] = {
        "moe block": (run_block(block), [x, *block.parameters()]),
        "reference block": (run_block(reference), [x, *reference.parameters()]),
        "dense mlp": (lambda: (dense(x),), [x, *dense.parameters()]),
        "router": (router, [x, *block.router.parameters()]),
        "permute": (permute_piece, [x_rows, weights]),
        "experts": (expert_gemms, [rows, row_weights, *expert_params]),
        "combine": (lambda: (combine(y, dispatch),), [y]),
    }
    if len(block.shared):
        forwards["shared"] = (shared, [x, *block.shared.parameters()])
    candidates = {}
    for name, (forward, leaves) in forwards.items():
        if compile:
            forward = torch.compile(forward)
        with torch.no_grad(), autocast(device, precision):
            outputs = forward()
        candidates[name] = Candidate(forward, _output_grads(outputs, generator), leaves, backward)
    chosen = dispatch.layout.kind
    return BlockBench(candidates, block, reference, x, f"{kind} -> {chosen}" if kind != chosen else kind)


def block_error(bench: BlockBench, device: torch.device, precision: str) -> float:
    """Largest |grouped - reference| / max |reference| over the block's output, the input's gradient and every
    parameter's gradient (one forward and backward each, with the same output gradients)."""
    results = []
    output_grads = bench.candidates["moe block"].grads  # the same for both
    for name in ("moe block", "reference block"):
        candidate = bench.candidates[name]
        candidate.prepare()
        with autocast(device, precision):
            outputs = candidate.forward()
        torch.autograd.backward(list(outputs), output_grads)
        module = bench.block if name == "moe block" else bench.reference
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]
        results.append([outputs[0].detach().float(), bench.x.grad.float(), *(g.float() for g in grads)])
        candidate.prepare()
    error = 0.0
    for fast, ref in zip(*results, strict=True):
        scale = ref.abs().max().item()
        error = max(error, (fast - ref).abs().max().item() / scale if scale else (fast - ref).abs().max().item())
    return error
