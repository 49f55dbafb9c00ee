"""The Mixture-of-Experts block's terms for the vectorized evaluator, as arrays.

A MoE block (`ops_moe.py`) depends on few plan fields: the tokens of a micro-batch on one GPU (b·s/cp), tp,
ep, sequence parallelism and how many members of the TP and EP groups share a fast domain (the workload, the
system and the switches a search keeps fixed aside). A search crosses those few combinations with placements
of the other groups, pipeline shapes, ZeRO stages and recompute modes, so it holds a few hundred to a few
thousand distinct MoE blocks among millions of candidates. Each distinct block is therefore evaluated once,
by the reference itself (the ops of `ops_moe.moe_block`, timed by `timing.op_time` and
`collectives.collective_time` as `evaluate.direction_span` times them), kept in a table for the rest of the
search, and gathered into arrays: the vectorized evaluator equals the reference for the MoE block by
construction, and costs a table lookup per group of candidates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.ops import Geometry
from stepscope.perfmodel.ops_moe import moe_block
from stepscope.perfmodel.timing import dispatcher_sm_share, exposed, op_time, overlapped_exchange
from stepscope.spec import ModelSpec
from stepscope.spec.system import SystemSpec

FIELDS = ("fwd", "bwd", "tp_fwd", "tp_bwd", "ep_fwd", "ep_bwd", "params", "expert_params", "fp8_params", "saved",
          "saved_max", "flops")
"""What the table holds per distinct block: op time forward and backward, exposed TP and EP collectives
forward and backward, parameters per GPU (without the routed experts when they have a data-parallel group of
their own, `Geometry.experts_apart`, which are then `expert_params`), the fp8 GEMM weights among `params`, saved
activation bytes (all, and the largest op's), forward model FLOPs (what full recomputation repeats)."""

_TABLES: dict[tuple, tuple[Any, Any, dict[tuple[int, ...], tuple[float, ...]], dict[tuple[int, ...], tuple]]] = {}
_MAX_TABLES = 32


def _ops(spec: ModelSpec, system: SystemSpec, settings: tuple, key: tuple[int, ...]) -> tuple:
    """What of a block does not depend on where its groups sit: per direction, the ops' summed time, the
    GEMMs' compute (the window all-to-alls can hide behind) and each collective with the compute of its op;
    then the parameter, activation and FLOP sums. Blocks differing only in placement share it."""
    act_bytes, precision, fp8_recipe, dropout, _, imbalance, _, dispatcher, expert_tp = settings
    tokens, t, ep, sp = key
    # a MoE block sees a micro-batch only through its tokens per GPU, b·s/cp (an integer: cp splits s evenly)
    g = Geometry(tokens, 1, act_bytes, t, 1, bool(sp), True, dropout, fp8_recipe, ep, imbalance, dispatcher,
                 expert_tp)
    ops = moe_block(spec, g)
    directions = []
    for direction in ("forward", "backward"):
        total = window = 0.0
        comms = []
        for op in ops:
            cost = getattr(op, direction)
            timed = op_time(cost, op.kind, system.accelerator, "fp8" if op.fp8 else precision)
            total += timed.total_s
            if op.kind == "matrix":
                window += timed.compute_s
            comms += [(comm, timed.compute_s) for comm in cost.comms]
        directions.append((total, window, comms))
    split = g.experts_apart
    sums = (sum(op.params for op in ops if not (split and op.expert)),
            sum(op.params for op in ops if split and op.expert),
            sum(op.params for op in ops if op.fp8 and not (split and op.expert)),
            sum(op.saved_bytes for op in ops), max(op.saved_bytes for op in ops),
            sum(op.forward.model_flops for op in ops))
    return tuple(directions), sums


def _block(spec: ModelSpec, system: SystemSpec, settings: tuple, key: tuple[int, ...],
           ops: tuple) -> tuple[float, ...]:
    """One MoE block's terms: the reference's ops (`_ops`) and their collectives timed on the block's layout,
    summed in the reference's order."""
    overlap, ep_overlap = settings[4], settings[6]
    sm_share = dispatcher_sm_share(settings[7], system.accelerator)
    g_tp, g_ep = key[3], key[4]
    layout = {"tp": g_tp, "ep": g_ep}
    out = dict.fromkeys(FIELDS, 0.0)
    for short, (total, window, comms) in zip(("fwd", "bwd"), ops[0], strict=True):
        out[short] = total
        for comm, compute_s in comms:
            seconds = comm.seconds(layout[comm.group], system.network)
            if comm.group == "ep" and ep_overlap:
                out[f"ep_{short}"] += seconds
            else:
                out[f"{comm.group}_{short}"] += exposed(seconds, compute_s, comm.hides(layout[comm.group], overlap))
        if ep_overlap:  # evaluate.direction_span: the all-to-alls behind the block's GEMMs
            out[f"ep_{short}"] = overlapped_exchange(out[f"ep_{short}"], window, sm_share)
    out.update(zip(("params", "expert_params", "fp8_params", "saved", "saved_max", "flops"), ops[1], strict=True))
    return tuple(out[name] for name in FIELDS)


def moe_block_terms(spec: ModelSpec, system: SystemSpec, settings: tuple, tokens: np.ndarray, tp: np.ndarray,
                    ep: np.ndarray, g_tp: np.ndarray, g_ep: np.ndarray, sp: np.ndarray) -> dict[str, np.ndarray]:
    """`FIELDS` as arrays, one element per plan of `tokens` (b·s/cp) per GPU. `settings`: (activation bytes,
    activation precision, fp8 recipe or None, dropout, tp_overlap, expert_imbalance, ep_overlap, dispatcher,
    expert_tp), what every plan of the call shares."""
    cache_key = (id(spec), id(system), settings)
    if cache_key not in _TABLES:
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.clear()
        _TABLES[cache_key] = (spec, system, {}, {})  # the objects stay referenced, so their ids stay theirs
    _, _, table, op_table = _TABLES[cache_key]
    columns = [np.asarray(x).astype(np.int64) for x in (tokens, tp, ep, g_tp, g_ep, sp)]
    columns = [np.broadcast_to(x, (len(columns[0]),)) for x in columns]
    # one integer per key (each column numbered by its distinct values), then the distinct keys
    numbered = [np.unique(x, return_inverse=True) for x in columns]
    code = np.ravel_multi_index([inv.reshape(-1) for _, inv in numbered], [len(u) for u, _ in numbered])
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rows = []
    for row in np.stack(columns, axis=1)[first].tolist():
        key = tuple(row)
        if key not in table:
            ops_key = (key[0], key[1], key[2], key[5])  # tokens, tp, ep, sequence parallelism
            if ops_key not in op_table:
                op_table[ops_key] = _ops(spec, system, settings, ops_key)
            table[key] = _block(spec, system, settings, key, op_table[ops_key])
        rows.append(table[key])
    values = np.array(rows, dtype=float)[inverse.reshape(-1)]
    return {name: values[:, i] for i, name in enumerate(FIELDS)}


def attention_tp(overlap, qkv_c, out_c, rs_block, ar_block) -> tuple[tuple, tuple]:
    """Exposed TP collectives of an attention block alone, ((sequence-parallel, all-reduce) forward, (...)
    backward): `vectorized_terms`' layer formulas without the MLP's two GEMMs. `overlap`: per plan, whether
    its TP collectives hide (`Collective.hides`)."""
    def hidden(comm, compute):
        return np.where(overlap, np.maximum(0.0, comm - compute), comm)

    forward = (hidden(rs_block, qkv_c) + hidden(rs_block, out_c), hidden(ar_block, out_c))
    backward = (hidden(rs_block, 2 * qkv_c) + hidden(rs_block, 2 * out_c), hidden(ar_block, 2 * qkv_c))
    return forward, backward


def expert_dp_terms(mc: Any, experts: np.ndarray, ep: np.ndarray, n_dp: np.ndarray, g_dp: np.ndarray, cap: float,
                    gb: int, e: int, fp8_gather: bool) -> dict[str, np.ndarray]:
    """The expert gradients' reduction (all-reduce or reduce-scatter, size-based buckets) and the expert weights'
    gather over the n_dp / ep expert-data-parallel ranks (`evaluate`: only where the experts have a group of
    their own, `experts_apart`); n_dp and g_dp are the ranks EP is carved out of (dp x cp, x tp with whole
    experts) and how many share a domain."""
    n_edp, g_edp = n_dp / ep, np.maximum(1.0, np.floor(g_dp / ep))
    some = experts > 0
    n_full = np.maximum(0, np.ceil(experts / cap) - 1)
    last = experts - n_full * cap
    return {"ar_exp": np.where(some, n_full * mc.all_reduce(cap * gb, n_edp, g_edp)
                               + mc.all_reduce(last * gb, n_edp, g_edp), 0.0),
            "rs_exp": np.where(some, n_full * mc.reduce_scatter(cap * gb, n_edp, g_edp)
                               + mc.reduce_scatter(last * gb, n_edp, g_edp), 0.0),
            "exp_weights": np.where(some, mc.reduce_scatter(experts * e, n_edp, g_edp), 0.0),
            "exp_weights_z3": np.where(some, mc.reduce_scatter(experts * (1 if fp8_gather else e), n_edp, g_edp),
                                       0.0)}
