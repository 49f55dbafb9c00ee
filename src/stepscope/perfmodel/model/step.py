"""One training step from a plan's `Terms` and its ZeRO stage and recompute mode: the pipeline's pace and bubble,
the data-parallel exposure, the optimizer, the phases and the breakdown by cause, FLOPs, MFU, and the memory of
the fullest stage. Over numpy arrays that broadcast: `evaluate.evaluate_many` passes the terms of groups of plans
(axis 0) and the ZeRO stages and recompute modes of their members (the other axes).

The rules (the slowest stage sets the pace, the bubble, what data parallelism exposes, memory by ZeRO stage and
schedule): docs/model.md, "The training stack" and "Memory".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.data_parallel import Windows
from stepscope.perfmodel.model.data_parallel import exposed as data_parallel_exposed
from stepscope.perfmodel.model.ops import activation_precision
from stepscope.perfmodel.model.schedule import bubble
from stepscope.perfmodel.model.terms import Span, Terms
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.stack import load_stack
from stepscope.spec.system import SystemSpec

GiB = 2.0**30

CAUSES = ("forward_compute", "backward_compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble",
          "dp_comm", "optimizer")
"""The breakdown of a step by cause; its seconds sum to the step time."""
PHASES = ("forward", "backward", "optimizer", "bubble")


def _choose(index: Any, options: list[Any]) -> Any:
    """options[index] element-wise for an index 0, 1 or 2 (a stage, or a recompute mode)."""
    return np.where(index == 0, options[0], np.where(index == 1, options[1], options[2]))


def _choose_span(index: Any, options: list[Span]) -> Span:
    return options[2].where(index == 2, options[1].where(index == 1, options[0]))


def assemble(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates, T: Terms, zero: Any,
             rec: Any) -> dict[str, Any]:
    """Every output of a prediction (phases and breakdown in seconds or ms, step_s, tokens/s, MFU, HFU, memory)."""
    backward = workload.mode != "fwd"
    m, pp, rounds = T.m, T.pp, T.rounds

    # ---- pipeline stages: the slowest sets the pace ------------------------------------------------------
    kinds = [(T.dense, T.dense.backward + _choose_span(rec, list(T.dense.recompute)))]
    if T.moe is not None:
        kinds.append((T.moe, T.moe.backward + _choose_span(rec, list(T.moe.recompute))))
    staged = []
    for i, blocks in enumerate(T.stage_blocks):
        forward, backward_span = Span(), Span()
        for (kind, kind_backward), count in zip(kinds, blocks, strict=False):
            forward, backward_span = forward + kind.forward * count, backward_span + kind_backward * count
        if i == 0:
            forward, backward_span = forward + T.embedding[0], backward_span + T.embedding[1]
        forward = forward + T.head[0] * T.holds_head[i]
        backward_span = backward_span + T.head[1] * T.holds_head[i]
        staged.append((forward, backward_span))
    totals = [np.where(T.stage_exists[i], f.total_s + b.total_s, -np.inf) for i, (f, b) in enumerate(staged)]
    pace = np.argmax(np.stack(np.broadcast_arrays(*totals)), axis=0)
    stage_fwd = _choose_span(pace, [f for f, _ in staged])
    stage_bwd = _choose_span(pace, [b for _, b in staged])
    stage_rec = sum(_choose(rec, [r.compute_s for r in kind.recompute]) * _choose(pace, [b[k] for b in T.stage_blocks])
                    for k, (kind, _) in enumerate(kinds))
    p2p_fwd, p2p_bwd = T.p2p_s

    # ---- data parallelism: gradient reduction, HSDP replicas, weight gathers, as the stack schedules them -----
    dp = T.dp_sizes
    optimizer_s = np.where(zero >= 1, T.optimizer_s[1], T.optimizer_s[0])
    windows = Windows(forward=stage_fwd.total_s, backward=stage_bwd.total_s, p2p=T.p2p_one,
                      optimizer=optimizer_s, blocks=T.critical_blocks)
    share = min(1.0, system.network.collective_sms / system.accelerator.sm_count) if (
        system.network.collective_sms and system.accelerator.sm_count) else 0.0
    reduce_s, gather_s = data_parallel_exposed(
        load_stack(c.stack).data_parallel, T.dp, windows, zero=zero, pp=pp, interleave=T.interleave, rounds=rounds,
        micro_batches=m, backward=backward, train=workload.mode == "train",
        reshard_after_forward=c.reshard_after_forward, overlap=c.dp_overlap, share=share)
    experts = _choose(T.critical, [p[1] for p in T.stage_params])
    has_dp = (dp["dp_cp"] > 1) | ((experts > 0) & (dp["edp"] > 1))
    reduce_s = np.where(has_dp & backward, reduce_s, 0.0)
    gather_s = np.where(has_dp, gather_s, 0.0)

    # ---- phases, breakdown, FLOPs --------------------------------------------------------------------------
    bubble_s = bubble(pp, T.interleave, stage_fwd.total_s + stage_bwd.total_s + p2p_fwd + p2p_bwd, rounds)
    fill_s = rounds * T.p2p_fill  # the sends an overlapping schedule cannot hide, in its fill and drain
    zero3_gather_s = np.where(zero == 3, gather_s, 0.0)  # in the backward phase, or forward's without one
    out = {"forward_ms": 1e3 * (m * (stage_fwd.total_s + p2p_fwd) + (0.0 if backward else zero3_gather_s)),
           "backward_ms": 1e3 * (m * (stage_bwd.total_s + p2p_bwd) + reduce_s + (zero3_gather_s if backward else 0.0)),
           "optimizer_ms": 1e3 * (optimizer_s + np.where(zero == 3, 0.0, gather_s)),
           "bubble_ms": 1e3 * (bubble_s + fill_s),
           "forward_compute_s": m * stage_fwd.compute_s, "backward_compute_s": m * (stage_bwd.compute_s - stage_rec),
           "recompute_s": m * stage_rec, "tp_comm_s": m * (stage_fwd.tp_s + stage_bwd.tp_s),
           "cp_comm_s": m * (stage_fwd.cp_s + stage_bwd.cp_s), "ep_comm_s": m * (stage_fwd.ep_s + stage_bwd.ep_s),
           "pp_comm_s": m * (p2p_fwd + p2p_bwd) + fill_s, "bubble_s": bubble_s, "dp_comm_s": reduce_s + gather_s,
           "optimizer_s": optimizer_s}
    step = sum(out[f"{phase}_ms"] for phase in PHASES) / 1e3
    seq = workload.seq
    tokens = workload.batch * seq
    model_flops = tokens * (spec.flops_per_token(seq) if backward else spec.forward_flops_per_token(seq))
    recompute_flops = 0.0
    if backward:
        per_layers = sum(_choose(rec, list(kind.recompute_flops)) * layers for (kind, _), layers in
                         zip(kinds, (spec.n_layers - spec.moe_layers, spec.moe_layers), strict=False))
        recompute_flops = per_layers / pp * m * T.gpus
    peak = system.accelerator.matrix_peak(activation_precision(workload.precision))  # 16-bit peak for fp8 runs too
    gpus = T.gpus
    out.update({"step_s": step, "tokens_per_s": tokens / step, "mfu_pct": 100 * model_flops / (step * gpus * peak),
                "hfu_pct": 100 * (model_flops + recompute_flops) / (step * gpus * peak), "model_flops": model_flops,
                "hardware_flops": model_flops + recompute_flops, "pace_stage": pace,
                "params_per_gpu": _choose(T.critical, [p[0] + p[1] for p in T.stage_params])})
    out.update(_memory(workload, system, c, T, zero, rec))
    return out


def state_bytes(precision: str, zero: Any, ranks: Any, fp32_grads: bool = False,
                keeps_weights: Any = False) -> tuple[Any, Any, Any]:
    """Bytes per parameter of (weights, gradients, Adam state) on one GPU at a ZeRO stage, sharded over `ranks`:
    16-bit weights and gradients (fp32 in fp32 training; 4-byte gradients with `fp32_grads`), Adam's m and v and,
    in mixed precision, the fp32 master weights; ZeRO shards the state (1), the gradients (2), the weights (3);
    `keeps_weights`: ZeRO-3 weights stay gathered (FSDP without resharding after forward)."""
    e = float(bytes_per_element(precision))
    grad = 4.0 if fp32_grads else e
    adam = 8.0 + (4.0 if precision != "fp32" else 0.0)
    return (np.where((zero >= 3) & ~np.asarray(keeps_weights), e / ranks, e),
            np.where(zero >= 2, grad / ranks, grad), np.where(zero >= 1, adam / ranks, adam))


def _memory(workload: Workload, system: SystemSpec, c: Candidates, T: Terms, zero: Any, rec: Any) -> dict[str, Any]:
    """Peak bytes per GPU on the fullest stage, in GiB, and whether it fits (module docstring)."""
    act = activation_precision(workload.precision)
    through_round = (T.pp > 1) & (workload.mode != "fwd")  # a pipeline schedule keeps gradients through a round
    zero = np.where(through_round & (zero >= 2), 1, zero)
    keeps = (zero == 3) & (not c.reshard_after_forward)  # FSDP without resharding keeps the gathered weights

    shared, routed = (state_bytes(act, zero, T.dp_sizes[group], c.fp32_grads, keeps) for group in ("shard", "edp"))
    kinds = [T.dense] + ([T.moe] if T.moe is not None else [])
    per_layer = [_choose(rec, list(kind.activations)) for kind in kinds]
    gathered = np.where((zero >= 3) & ~keeps, T.gathered_layer_bytes, 0.0)
    working = np.where(rec == 2, np.maximum.reduce([kind.saved_all for kind in kinds]), 0.0) + gathered
    stages = []
    for i, (params, experts) in enumerate(T.stage_params):
        activations = (sum(a * n for a, n in zip(per_layer, T.stage_blocks[i], strict=False)) * T.held[i] + working
                       + T.head_activation_bytes * T.holds_head[i])
        total = params * sum(shared) + experts * sum(routed) + activations
        stages.append((np.where(T.stage_exists[i], total, -np.inf), params, experts, activations))
    fullest = np.argmax(np.stack(np.broadcast_arrays(*[s[0] for s in stages])), axis=0)
    params, experts, activations = (_choose(fullest, [s[k] for s in stages]) for k in (1, 2, 3))
    weights, grads, optimizer = (params * a + experts * b for a, b in zip(shared, routed, strict=True))
    if workload.mode != "train":  # no optimizer exists; a forward-only pass keeps no gradients
        optimizer = np.zeros(np.shape(weights))
        if workload.mode == "fwd":
            grads = np.zeros(np.shape(weights))
            activations = T.forward_only_bytes + gathered
    total = weights + grads + optimizer + activations
    capacity = system.accelerator.capacity_bytes
    return {"weights_GiB": weights / GiB, "grads_GiB": grads / GiB, "optimizer_GiB": optimizer / GiB,
            "activations_GiB": activations / GiB, "mem_GiB": total / GiB,
            "capacity_GiB": np.full(np.shape(total), capacity / GiB), "feasible": total <= capacity}
