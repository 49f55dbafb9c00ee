"""Group-level terms of the vectorized evaluator: everything about a plan that does not depend on its ZeRO
stage or recompute mode (op times, tensor/context/pipeline communication, parameters per stage, the
data-parallel collectives of each kind, activation bytes of each recompute mode), as arrays.

A search repeats every (shape, placement, attention kind) for each ZeRO stage and recompute mode, so
`vectorized.evaluate_many` computes these terms once per group and broadcasts them. The formulas are
`ops.py`, `timing.py`, `collectives.py` and `memory.py` written element-wise; `tests/perfmodel/
test_vectorized.py` checks the result against the op-by-op reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepscope.perfmodel.candidates import Candidates
from stepscope.perfmodel.evaluate import param_tensors
from stepscope.perfmodel.ops import ROPE_KERNELS_PER_TENSOR, VECTOR_BACKWARD, VECTOR_FLOPS
from stepscope.perfmodel.timing import OPTIMIZER_FLOPS_PER_PARAM, optimizer_bytes_per_param
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.system import SystemSpec


@dataclass
class Machine:
    """The system's rates, unpacked once for array arithmetic."""

    peak: float
    vector_peak: float
    optimizer_peak: float
    bandwidth: float
    overhead: float
    flash_efficiency: float
    knots_x: np.ndarray
    knots_inverse: np.ndarray
    domain: int
    intra_bw: float
    intra_lat: float
    inter_bw: float
    inter_lat: float

    @classmethod
    def of(cls, system: SystemSpec, precision: str) -> Machine:
        acc, net = system.accelerator, system.network
        knots = acc.matrix_efficiency_by_GFLOP
        optimizer_peak = acc.vector_peak("fp32") if "fp32" in acc.vector_TFLOPps else acc.vector_peak(precision)
        return cls(acc.matrix_peak(precision), acc.vector_peak(precision), optimizer_peak, acc.memory_bytes_per_s,
                   acc.kernel_overhead_us * 1e-6, acc.flash_efficiency,
                   np.array([math.log10(k[0]) for k in knots]), np.array([1.0 / k[1] for k in knots]),
                   net.domain_size, net.intra.bytes_per_s, net.intra.latency_s, net.inter.bytes_per_s,
                   net.inter.latency_s)

    # ---- op times: (compute, total) -------------------------------------------------------------
    def matrix(self, flops, moved, kernels, factor=1.0):
        per_kernel = np.maximum(flops / kernels, 1.0)
        inverse = np.interp(np.log10(per_kernel / 1e9), self.knots_x, self.knots_inverse)
        compute = flops * inverse / (self.peak * factor)
        return compute, np.maximum(compute, moved / self.bandwidth) + kernels * self.overhead

    def vector(self, flops, moved, kernels):
        compute = flops / self.vector_peak
        return compute, np.maximum(compute, moved / self.bandwidth) + kernels * self.overhead

    # ---- collectives (collectives.py, element-wise) ----------------------------------------------
    def all_reduce(self, nbytes, n, g):
        domains = np.ceil(n / g)
        ring = (2 * (g - 1) / g * nbytes / self.intra_bw + 2 * (g - 1) * self.intra_lat
                + 2 * (domains - 1) / domains * (nbytes / g) / self.inter_bw + 2 * (domains - 1) * self.inter_lat)
        intra = g >= n
        steps = 2 * np.ceil(np.log2(np.maximum(n, 1)))
        tree = np.where(intra, steps * self.intra_lat + 2 * nbytes / self.intra_bw,
                        steps * self.inter_lat + 2 * nbytes / self.inter_bw)
        return np.where(n > 1, np.minimum(ring, tree), 0.0)

    def reduce_scatter(self, nbytes, n, g):
        domains = np.ceil(n / g)
        t = ((g - 1) / g * nbytes / self.intra_bw + (g - 1) * self.intra_lat
             + (domains - 1) / domains * (nbytes / g) / self.inter_bw + (domains - 1) * self.inter_lat)
        return np.where(n > 1, t, 0.0)

    def p2p(self, nbytes, same_domain):
        return np.where(same_domain, self.intra_lat + nbytes / self.intra_bw, self.inter_lat + nbytes / self.inter_bw)


def _exposed(comm, compute, overlap: bool):
    return np.maximum(0.0, comm - compute) if overlap else comm


def group_terms(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates,
                bucket_cap_MiB: float) -> dict[str, np.ndarray]:
    """Per-plan terms that ignore `c.zero` and `c.recompute` (arrays, one element per plan of `c`)."""
    mc = Machine.of(system, workload.precision)
    precision, mode = workload.precision, workload.mode
    backward = mode != "fwd"
    e = bytes_per_element(precision)
    h, kv, f, vocab, seq = spec.d_model, spec.kv_dim, spec.d_ff, spec.vocab_size, workload.seq
    heads, gated = spec.n_heads, spec.mlp == "swiglu"
    b, t, cp, pp, dp, v = (c.micro_batch.astype(float), c.tp.astype(float), c.cp.astype(float),
                           c.pp.astype(float), c.dp.astype(float), c.interleave.astype(float))
    sp, flash = c.sequence_parallel, c.flash_attention
    mask = 1 if c.dropout else 0
    overlap = c.tp_overlap
    layout = c.members_per_domain(mc.domain)
    g_tp, g_cp = layout["tp"], layout["cp"]
    # gradients are reduced (and ZeRO shards) over the dp x cp ranks holding the same weights
    n_dp, g_dp = dp * cp, layout["dp"] * layout["cp"]
    tokens = b * seq / cp
    sharded = np.where(sp, tokens / t, tokens)
    m = workload.batch // (c.dp * c.micro_batch)
    layers = spec.n_layers // c.pp
    zeros = np.zeros(len(c))

    def back(compute_fwd, moved_fwd, kind: str, kernels: int):
        """Backward time of an elementwise op from its forward compute time and bytes (ops.VECTOR_BACKWARD)."""
        factor = VECTOR_BACKWARD[kind]
        return np.maximum(factor * compute_fwd, factor * moved_fwd / mc.bandwidth) + kernels * mc.overhead

    # ---- tensor-parallel collectives of one block: entry and exit, as in ops._tp_entry_exit ----------
    act = tokens * h * e
    ar_block = mc.all_reduce(act, t, g_tp)
    rs_block = mc.reduce_scatter(act, t, g_tp)  # all-gather costs the same

    # ---- attention block (backward of a matrix op = 2 x its forward: two GEMMs of the same size) -----
    norm_c, norm_t = mc.vector(VECTOR_FLOPS["norm"] * sharded * h, 2 * sharded * h * e, 1)
    norm_bt = back(norm_c, 2 * sharded * h * e, "norm", 1)
    qkv_c, qkv_t = mc.matrix(2 * tokens * h * (h + 2 * kv) / t, (tokens * h + h * (h + 2 * kv) / t
                                                                   + tokens * (h + 2 * kv) / t) * e, 1)
    out_c, out_t = mc.matrix(2 * tokens * h / t * h, (tokens * h / t + h / t * h + tokens * h) * e, 1)
    residual_bytes = sharded * h * (3 * e + mask)
    res_c, res_t = mc.vector((VECTOR_FLOPS["residual"] + (VECTOR_FLOPS["dropout"] if mask else 0.0)) * sharded * h,
                             residual_bytes, 1)
    res_bt = back(res_c, residual_bytes, "residual", 1)
    fwd = norm_t + qkv_t + out_t + res_t
    bwd = norm_bt + 2 * qkv_t + 2 * out_t + res_bt
    if spec.positions == "rope":
        rotated = tokens * (h + kv) / t
        rope_c, rope_t = mc.vector(VECTOR_FLOPS["rope"] * rotated, 2 * rotated * e, 2 * ROPE_KERNELS_PER_TENSOR)
        fwd = fwd + rope_t
        bwd = bwd + back(rope_c, 2 * rotated * e, "rope", 2 * ROPE_KERNELS_PER_TENSOR)

    # attention core: fused flash kernel, or scores / softmax / dropout / values
    queries = b * seq / cp
    square = 2.0 * queries * seq * h / t
    qk_bytes, v_bytes = tokens * (h + kv) / t * e, tokens * kv / t * e
    lse = 4.0 * heads / t * queries
    flash_moved = tokens * (2 * h + 2 * kv) / t * e
    scores_el = heads / t * queries * seq
    any_flash, any_unfused = bool(flash.any()), not bool(flash.all())  # a search often has one kind only
    if any_flash:
        fl_fc, fl_ft = mc.matrix(square, flash_moved + lse, 1, mc.flash_efficiency)
        fl_bc, fl_bt = mc.matrix(2.5 * square, 2 * flash_moved + lse, 1, mc.flash_efficiency)
    if any_unfused:
        sc_c, sc_t = mc.matrix(square, qk_bytes + scores_el * e, 1)
        sm_c, sm_t = mc.vector(VECTOR_FLOPS["softmax"] * scores_el, 2 * scores_el * e, 1)
        sm_bt = back(sm_c, 2 * scores_el * e, "softmax", 1)
        if mask:
            do_c, do_t = mc.vector(VECTOR_FLOPS["dropout"] * scores_el, scores_el * (2 * e + mask), 1)
            do_bt = back(do_c, scores_el * (2 * e + mask), "dropout", 1)
        else:
            do_t = do_bt = zeros
        va_c, va_t = mc.matrix(square, scores_el * e + v_bytes + tokens * h / t * e, 1)
        unfused_fwd = sc_t + sm_t + do_t + va_t
        unfused_bwd = 2 * sc_t + sm_bt + do_bt + 2 * va_t
    if any_flash and any_unfused:
        core_fwd, core_bwd = np.where(flash, fl_ft, unfused_fwd), np.where(flash, fl_bt, unfused_bwd)
        core_fwd_compute = np.where(flash, fl_fc, sc_c)  # the op the context-parallel exchange belongs to
        core_bwd_compute = np.where(flash, fl_bc, 2 * sc_c)
    elif any_flash:
        core_fwd, core_bwd, core_fwd_compute, core_bwd_compute = fl_ft, fl_bt, fl_fc, fl_bc
        unfused_fwd = zeros
    else:
        core_fwd, core_bwd, core_fwd_compute, core_bwd_compute = unfused_fwd, unfused_bwd, sc_c, 2 * sc_c
    fwd, bwd = fwd + core_fwd, bwd + core_bwd

    # ---- MLP block ----------------------------------------------------------------------------------
    up_w = (2 if gated else 1) * f / t
    up_c, up_t = mc.matrix(2 * tokens * h * up_w, (tokens * h + h * up_w + tokens * up_w) * e, 1)
    hidden = tokens * f / t
    if gated:
        ac_c, ac_t = mc.vector(VECTOR_FLOPS["swiglu"] * hidden, 3 * hidden * e, 2)
        ac_bt = back(ac_c, 3 * hidden * e, "swiglu", 2)
    else:
        ac_c, ac_t = mc.vector(VECTOR_FLOPS["gelu"] * hidden, 2 * hidden * e, 1)
        ac_bt = back(ac_c, 2 * hidden * e, "gelu", 1)
    dn_c, dn_t = mc.matrix(2 * tokens * f / t * h, (tokens * f / t + f / t * h + tokens * h) * e, 1)
    fwd = fwd + norm_t + up_t + ac_t + dn_t + res_t
    bwd = bwd + norm_bt + 2 * up_t + ac_bt + 2 * dn_t + res_bt

    # ---- exposed TP / CP collectives of one layer --------------------------------------------------
    tp_on = t > 1
    if overlap:
        sp_fwd = (_exposed(rs_block, qkv_c, True) + _exposed(rs_block, out_c, True)
                  + _exposed(rs_block, up_c, True) + _exposed(rs_block, dn_c, True))
        sp_bwd = (_exposed(rs_block, 2 * qkv_c, True) + _exposed(rs_block, 2 * out_c, True)
                  + _exposed(rs_block, 2 * up_c, True) + _exposed(rs_block, 2 * dn_c, True))
        ar_fwd = _exposed(ar_block, out_c, True) + _exposed(ar_block, dn_c, True)
        ar_bwd = _exposed(ar_block, 2 * qkv_c, True) + _exposed(ar_block, 2 * up_c, True)
    else:
        sp_fwd = sp_bwd = 4 * rs_block
        ar_fwd = ar_bwd = 2 * ar_block
    tp_fwd = np.where(tp_on, np.where(sp, sp_fwd, ar_fwd), 0.0)
    tp_bwd = np.where(tp_on, np.where(sp, sp_bwd, ar_bwd), 0.0)
    kv_bytes = 2 * b * seq * kv / t * e
    cp_comm = mc.reduce_scatter(kv_bytes, cp, g_cp)
    cp_fwd = np.where(cp > 1, _exposed(cp_comm, core_fwd_compute, overlap), 0.0)
    cp_bwd = np.where(cp > 1, _exposed(cp_comm, core_bwd_compute, overlap), 0.0)

    # ---- what selective recomputation re-runs: the unfused attention core (nothing with flash) ------
    sel_fwd = np.where(flash, 0.0, unfused_fwd)
    sel_cp = np.where(flash, 0.0, cp_fwd)
    if not backward:
        bwd = tp_bwd = cp_bwd = zeros

    # ---- embedding (first stage) and head (last stage) ---------------------------------------------
    learned = spec.positions == "learned"
    emb_c, emb_t = mc.vector(tokens * h * (1 + learned), tokens * h * e * (2 + 3 * learned), 1 + learned)
    emb_comm = np.where(tp_on, np.where(sp, rs_block, ar_block), 0.0)
    emb_fwd_tp = _exposed(emb_comm, emb_c, overlap)
    table = vocab * h / t
    _, emb_bt = mc.vector(tokens * h, table * 4 + 2 * tokens * h * e, 2)
    fn_c, fn_t = mc.vector(VECTOR_FLOPS["norm"] * sharded * h, 2 * sharded * h * e, 1)
    fn_bt = back(fn_c, 2 * sharded * h * e, "norm", 1)
    lg_c, lg_t = mc.matrix(2 * tokens * h * vocab / t, (tokens * h + h * vocab / t + tokens * vocab / t) * e, 1)
    head_fwd_tp = np.where(tp_on & sp, _exposed(rs_block, lg_c, overlap), 0.0)
    head_bwd_tp = np.where(tp_on, np.where(sp, _exposed(rs_block, 2 * lg_c, overlap),
                                           _exposed(ar_block, 2 * lg_c, overlap)), 0.0)
    logits = tokens * vocab / t
    upcast = 8.0 if e < 4 else 0.0
    ls_c, ls_t = mc.vector(VECTOR_FLOPS["loss"] * logits, logits * (e + upcast + 8), 3)
    _, ls_bt = mc.vector(2 * VECTOR_FLOPS["loss"] * logits, logits * (8 + (4 + e if e < 4 else 0)), 3)
    loss_comm = np.where(tp_on, _exposed(mc.all_reduce(12.0 * tokens, t, g_tp), ls_c, overlap), 0.0)

    # ---- pipeline point-to-point: activations forward, gradients back, once per virtual chunk --------
    p2p_one = np.where(c.pp > 1, mc.p2p(sharded * h * e, layout["pp"] >= c.pp), 0.0)
    p2p_fwd = v * p2p_one
    p2p_bwd = v * p2p_one if backward else zeros

    # ---- parameters per stage (pp = 1: everything on one stage) -----------------------------------
    norm_p = spec.norm_params()
    layer_p = (2 * norm_p + h * (h + 2 * kv) / t + ((h + 2 * kv) / t if spec.attn_bias else 0.0)
               + h * h / t + (h if spec.attn_bias else 0.0) + h * up_w + (up_w if spec.mlp_bias else 0.0)
               + f / t * h + (h if spec.mlp_bias else 0.0))
    emb_p = table + (spec.context_length * h if learned else 0.0)
    head_p = norm_p + (0.0 if spec.tie_embeddings else h * vocab / t)
    head_p_pp = head_p + (table if spec.tie_embeddings else 0.0)  # a tied projection is a copy on the last stage
    single = c.pp == 1
    first_p, last_p = layer_p * layers + emb_p, layer_p * layers + head_p_pp
    params = np.where(single, layer_p * layers + emb_p + head_p, np.maximum(first_p, last_p))
    critical_last = ~single & (last_p > first_p)

    # ---- data-parallel collectives: size-based buckets, all-reduce (ZeRO 0) or reduce-scatter --------
    gb = 4 if c.fp32_grads else e
    cap = bucket_cap_MiB * 2**20 / gb
    n_full = np.maximum(0, np.ceil(params / cap) - 1)
    last_bucket = params - n_full * cap
    terms = {"ar_full": mc.all_reduce(cap * gb, n_dp, g_dp), "ar_last": mc.all_reduce(last_bucket * gb, n_dp, g_dp),
             "rs_full": mc.reduce_scatter(cap * gb, n_dp, g_dp),
             "rs_last": mc.reduce_scatter(last_bucket * gb, n_dp, g_dp),
             "weights_s": mc.reduce_scatter(params * e, n_dp, g_dp),  # an all-gather costs the same
             "first_bucket": mc.reduce_scatter(np.minimum(params, cap) * e, n_dp, g_dp)}

    # ---- optimizer over all local parameters, or over a 1/dp shard (ZeRO >= 1) -----------------------
    if mode == "train":
        tensors = (param_tensors(spec, 1, False, False) * layers
                   + np.where(single | ~critical_last, param_tensors(spec, 0, True, False), 0)
                   + np.where(single | critical_last, param_tensors(spec, 0, False, True), 0))
        per_param = optimizer_bytes_per_param(precision, gb)
        for name, local in (("opt_full", params), ("opt_sharded", params / n_dp)):
            terms[name] = (np.maximum(OPTIMIZER_FLOPS_PER_PARAM * local / mc.optimizer_peak,
                                      local * per_param / mc.bandwidth) + tensors * mc.overhead)
    else:
        terms["opt_full"] = terms["opt_sharded"] = zeros

    # ---- activation bytes per layer and micro-batch of each recompute mode (memory.py) ---------------
    act_f = (2 if gated else 1) * tokens * f / t * e
    common = 4 * sharded * h * e + tokens * h / t * e + 2 * sharded * h * mask + act_f + tokens * f / t * e
    fused = qk_bytes + v_bytes + lse
    s_x_s = scores_el * e + (scores_el * (e + mask) if mask else 0.0)
    held = np.minimum(c.pp, m).astype(float)
    held = np.where(c.interleave > 1, held * (1 + (pp - 1) / (pp * v)), held)
    # inference keeps only the largest tensor one layer saves (memory.py's forward working set)
    core = np.where(flash, fused, np.maximum.reduce([qk_bytes, v_bytes, scores_el * (e + mask)]))
    terms.update({
        "act_none": common + np.where(flash, fused, qk_bytes + s_x_s + v_bytes),
        "act_selective": common + np.where(flash, fused, qk_bytes + v_bytes),
        "act_full": sharded * h * e,
        "act_forward_only": np.maximum.reduce([sharded * h * e, tokens * h / t * e, act_f, tokens * f / t * e, core]),
        "head_act": tokens * vocab / t * (e + 4 + (4 if e < 4 else 0)), "held": held})

    # ---- FLOPs a recomputation repeats (model FLOPs of the layer forward; or the attention core) ------
    layer_flops = 2 * tokens * h * (h + 2 * kv) / t + 2 * tokens * h * h / t + 2 * tokens * h * up_w + 2 * hidden * h
    terms.update({
        "m": m.astype(float), "layers": layers.astype(float), "single": single, "pp": pp, "v": v, "dp_cp": n_dp,
        "gpus": c.gpus.astype(float), "fwd": fwd, "bwd": bwd, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd, "cp_fwd": cp_fwd,
        "cp_bwd": cp_bwd, "sel_fwd": sel_fwd, "sel_cp": sel_cp,
        "first_fwd": emb_t, "first_fwd_tp": emb_fwd_tp, "last_fwd": fn_t + lg_t + ls_t,
        "last_fwd_tp": head_fwd_tp + loss_comm,
        "first_bwd": emb_bt if backward else zeros, "last_bwd": fn_bt + 2 * lg_t + ls_bt if backward else zeros,
        "last_bwd_tp": head_bwd_tp if backward else zeros,
        "p2p_fwd": p2p_fwd, "p2p_bwd": p2p_bwd, "params": params, "n_full": n_full,
        "layer_params": layer_p, "first_params": first_p, "last_params": last_p,
        "one_params": layer_p * layers + emb_p + head_p,
        "flops_full": layer_flops + square, "flops_selective": np.where(flash, 0.0, square)})
    return terms
