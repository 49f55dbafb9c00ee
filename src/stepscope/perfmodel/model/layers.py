"""The per-layer table of `stepscope predict --per-layer`, in the layout of the LBNL notebook
(Comprehensive Performance Modeling and System Design Insights for Foundation Models, 2024):
one row per op of one transformer block on one GPU and micro-batch, then the attention and MLP blocks
summed over the layers of the largest pipeline stage. For a Mixture-of-Experts model the block shown is a MoE
block (router, dispatch and combine all-to-alls, grouped expert GEMMs, shared experts) and the sums are `moe`
instead of `mlp`. With `ep_overlap` the token exchanges run behind the block's GEMMs: an op's own `t_total_ms`
leaves them out, and the block sums add what shows of them (`terms.direction_span`). The rows come from the same
ops, op times and collectives as every prediction (`terms.py`), on arrays of one plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.layout import geometry, group_layout
from stepscope.perfmodel.model.op_types import Cost, Op
from stepscope.perfmodel.model.ops import activation_precision, layer_ops
from stepscope.perfmodel.model.ops_moe import moe_layer_ops
from stepscope.perfmodel.model.rates import on_stack, op_time
from stepscope.perfmodel.model.schedule import dispatcher_sm_share
from stepscope.perfmodel.model.terms import direction_span
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.stack import load_stack
from stepscope.spec.system import SystemSpec

COLUMNS = ["layer", "flops_fwd_GFLOP", "act_mem_MiB", "wt_mem_MiB", "total_mem_fwd_MiB", "flops_bwd_GFLOP",
           "comm_fwd", "comm_bwd", "t_comp_ms", "t_mem_ms", "t_comm_ms", "intensity_FLOP_per_byte", "t_total_ms",
           "comm_fraction"]
_SHORT = {"all-reduce": "AR", "reduce-scatter": "RS", "all-gather": "AG", "all-to-all": "A2A", "dispatch": "DSP",
          "p2p": "P2P"}
MiB = 2.0**20


def _describe(cost: Cost) -> str:
    """The collectives that run (more than one rank, some bytes), e.g. `RS tp8 64MiB`."""
    return ", ".join(f"{_SHORT[c.kind]} {c.group}{_one(c.size):g} {_one(c.bytes) / MiB:.3g}MiB"
                     for c in cost.comms if _one(c.runs)) or "-"


def per_layer_rows(spec: ModelSpec, workload: Workload, plan: ParallelPlan, system: SystemSpec) -> list[dict[str, Any]]:
    """Rows for every op of one layer, then `attention xL`, `mlp xL` and `layer xL` sums over a stage."""
    e = bytes_per_element(activation_precision(workload.precision))
    system = on_stack(system, load_stack(plan.stack))
    c = Candidates.from_plans([plan])
    g = geometry(c, workload, plan.flash_attention)
    layout = group_layout(c, system.network.domain_size)
    dense_ops, moe_ops = layer_ops(spec, g), (moe_layer_ops(spec, g) if spec.is_moe else [])
    op_rows = [_row(op, workload, plan, system, layout, e) for op in (moe_ops or dense_ops)]
    rows = list(op_rows)
    layers = max(plan.stage_layers(spec.n_layers))
    shown_ep = 0.0  # seconds of the overlapped token exchanges that show, per block
    if moe_ops and plan.ep_overlap:
        act = activation_precision(workload.precision)
        share = dispatcher_sm_share(plan.dispatcher, system.accelerator)
        shown_ep = sum(float(direction_span(moe_ops, direction, system, act, layout, plan.tp_overlap, True,
                                            share).ep_s[0])
                       for direction in ("forward", "backward"))  # as the op rows, both directions
    for block in ("attention", "moe" if moe_ops else "mlp", None):
        members = [r for r in op_rows if block is None or r["_block"] == block]
        total = {c: sum(r[c] for r in members) * layers for c in COLUMNS
                 if c not in ("layer", "comm_fwd", "comm_bwd", "intensity_FLOP_per_byte", "comm_fraction")}
        if block != "attention":
            total["t_total_ms"] += 1e3 * shown_ep * layers
        total["layer"] = f"{block or 'layer'} x{layers}"
        total["comm_fwd"] = total["comm_bwd"] = ""
        total["intensity_FLOP_per_byte"] = (sum(r["_flops"] for r in members) / sum(r["_bytes"] for r in members))
        total["comm_fraction"] = total["t_comm_ms"] / total["t_total_ms"] if total["t_total_ms"] else 0.0
        rows.append(total)
    return [{c: r[c] for c in COLUMNS} for r in rows]


def _one(value: Any) -> float:
    """The single plan's value of an array of one (or a plain number)."""
    return float(np.asarray(value).reshape(-1)[0])


def _row(op: Op, workload: Workload, plan: ParallelPlan, system: SystemSpec, layout: dict[str, Any],
         e: int) -> dict[str, Any]:
    compute = memory = comm = total = 0.0
    for cost in (op.forward, op.backward):
        # as `terms.direction_span`: fp8 GEMMs at the fp8 rate, everything else in the activations' precision
        timed = op_time(cost, op.kind, system.accelerator,
                        "fp8" if op.fp8 and workload.precision == "fp8" else activation_precision(workload.precision))
        compute += _one(timed.compute_s)
        memory += _one(timed.memory_s)
        total += _one(timed.total_s)
        for c in cost.comms:
            comm += _one(c.total(layout[c.group], system.network))
            if not (c.group == "ep" and plan.ep_overlap):  # those show in the block sums (see the docstring)
                total += _one(c.exposed(layout[c.group], system.network, timed.compute_s, plan.tp_overlap))
    flops, moved, saved = _one(op.forward.flops), _one(op.forward.bytes), _one(op.saved_bytes)
    weights = _one(op.params) * e
    return {"layer": op.name, "_block": op.block, "_flops": flops, "_bytes": moved,
            "flops_fwd_GFLOP": flops / 1e9, "act_mem_MiB": saved / MiB, "wt_mem_MiB": weights / MiB,
            "total_mem_fwd_MiB": (saved + weights) / MiB, "flops_bwd_GFLOP": _one(op.backward.flops) / 1e9,
            "comm_fwd": _describe(op.forward), "comm_bwd": _describe(op.backward), "t_comp_ms": 1e3 * compute,
            "t_mem_ms": 1e3 * memory, "t_comm_ms": 1e3 * comm,
            "intensity_FLOP_per_byte": flops / moved if moved else 0.0, "t_total_ms": 1e3 * total,
            "comm_fraction": comm / total if total else 0.0}
