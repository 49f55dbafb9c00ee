"""Group-level terms of the vectorized evaluator: everything about a plan that does not depend on its ZeRO
stage or recompute mode (op times, tensor/context/pipeline communication, parameters per stage, the
data-parallel collectives of each kind, activation bytes of each recompute mode), as arrays.

A search repeats every (shape, placement, attention kind) for each ZeRO stage and recompute mode, so
`vectorized.evaluate_many` computes these terms once per group and broadcasts them. The formulas are
`ops.py`, `timing.py`, `collectives.py` and `memory.py` written element-wise; `tests/perfmodel/
test_vectorized.py` checks the result against the op-by-op reference.
"""

from __future__ import annotations

import numpy as np

from stepscope.perfmodel.candidates import Candidates
from stepscope.perfmodel.machine import Machine
from stepscope.perfmodel.ops import (
    FP8_CAST_BYTES,
    FP8_CAST_FLOPS,
    FP8_CAST_KERNELS,
    ROPE_KERNELS_PER_TENSOR,
    VECTOR_BACKWARD,
    VECTOR_FLOPS,
    activation_precision,
)
from stepscope.perfmodel.stages import held_micro_batches
from stepscope.perfmodel.tensors import param_tensors
from stepscope.perfmodel.timing import OPTIMIZER_FLOPS_PER_PARAM, optimizer_bytes_per_param
from stepscope.perfmodel.vectorized_moe import attention_tp, expert_dp_terms, moe_block_terms
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.plan import stage_layers
from stepscope.spec.system import SystemSpec


def _exposed(comm, compute, overlap):
    """What shows of `comm` behind `compute`; `overlap` a bool or an array of them (per plan)."""
    if isinstance(overlap, bool | np.bool_):
        return np.maximum(0.0, comm - compute) if overlap else comm
    return np.where(overlap, np.maximum(0.0, comm - compute), comm)


def group_terms(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates,
                bucket_cap_MiB: float) -> dict[str, np.ndarray]:
    """Per-plan terms that ignore `c.zero` and `c.recompute` (arrays, one element per plan of `c`)."""
    precision, mode = workload.precision, workload.mode
    act_precision = activation_precision(precision)  # fp8 training keeps activations and vector ops in bf16
    mc = Machine.of(system, act_precision)
    backward = mode != "fwd"
    e = bytes_per_element(act_precision)
    fp8 = precision == "fp8"
    f8 = system.accelerator.matrix_peak("fp8") / mc.peak * system.accelerator.fp8_efficiency if fp8 else 1.0  # vs 16b
    ge = 1 if fp8 else e  # bytes of a linear layer's inputs and weights (read, and saved for backward)
    h, q, kv, f, vocab, seq = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff, spec.vocab_size, workload.seq
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
    # ZeRO/FSDP shards over the innermost `shard` of them; HSDP replicas are one rank of every shard group
    n_shard = np.where(c.shard_group > 0, c.shard_group, n_dp).astype(float)
    replicas = n_dp / n_shard
    g_shard, g_rep = np.minimum(n_shard, g_dp), np.maximum(1.0, np.floor(g_dp / n_shard))
    tokens = b * seq / cp
    sharded = np.where(sp, tokens / t, tokens)
    m = workload.batch // (c.dp * c.micro_batch)
    first_l, mid_l, last_l = stage_layers(c.pp, c.first_stage_layers, c.last_stage_layers, spec.n_layers)
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
    qkv_c, qkv_t = mc.matrix(2 * tokens * h * (q + 2 * kv) / t, (tokens * h + h * (q + 2 * kv) / t) * ge
                             + tokens * (q + 2 * kv) / t * e, 1, f8)
    out_c, out_t = mc.matrix(2 * tokens * q / t * h, (tokens * q / t + q / t * h) * ge + tokens * h * e, 1, f8)
    residual_bytes = sharded * h * (3 * e + mask)
    res_c, res_t = mc.vector((VECTOR_FLOPS["residual"] + (VECTOR_FLOPS["dropout"] if mask else 0.0)) * sharded * h,
                             residual_bytes, 1)
    res_bt = back(res_c, residual_bytes, "residual", 1)
    fwd = norm_t + qkv_t + out_t + res_t
    bwd = norm_bt + 2 * qkv_t + 2 * out_t + res_bt
    if spec.positions == "rope":
        rotated = tokens * (q + kv) / t
        rope_c, rope_t = mc.vector(VECTOR_FLOPS["rope"] * rotated, 2 * rotated * e, 2 * ROPE_KERNELS_PER_TENSOR)
        fwd = fwd + rope_t
        bwd = bwd + back(rope_c, 2 * rotated * e, "rope", 2 * ROPE_KERNELS_PER_TENSOR)

    # attention core: fused flash kernel, or scores / softmax / dropout / values
    queries = b * seq / cp
    square = 2.0 * queries * seq * q / t
    qk_bytes, v_bytes = tokens * (q + kv) / t * e, tokens * kv / t * e
    lse = 4.0 * heads / t * queries
    flash_moved = tokens * (2 * q + 2 * kv) / t * e
    scores_el = heads / t * queries * seq
    any_flash, any_unfused = bool(flash.any()), not bool(flash.all())  # a search often has one kind only
    if any_flash:
        fl_fc, fl_ft = mc.matrix(square, flash_moved + lse, cp, mc.flash_efficiency)  # one kernel per ring step
        fl_bc, fl_bt = mc.matrix(2.5 * square, 2 * flash_moved + lse, cp, mc.flash_efficiency)
    if any_unfused:
        sc_c, sc_t = mc.matrix(square, qk_bytes + scores_el * e, 1)
        sm_c, sm_t = mc.vector(VECTOR_FLOPS["softmax"] * scores_el, 2 * scores_el * e, 1)
        sm_bt = back(sm_c, 2 * scores_el * e, "softmax", 1)
        if mask:
            do_c, do_t = mc.vector(VECTOR_FLOPS["dropout"] * scores_el, scores_el * (2 * e + mask), 1)
            do_bt = back(do_c, scores_el * (2 * e + mask), "dropout", 1)
        else:
            do_t = do_bt = zeros
        va_c, va_t = mc.matrix(square, scores_el * e + v_bytes + tokens * q / t * e, 1)
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
    att_fwd, att_bwd = fwd, bwd  # the attention block (a MoE block follows it in MoE layers)

    # ---- MLP block ----------------------------------------------------------------------------------
    up_w = (2 if gated else 1) * f / t
    up_c, up_t = mc.matrix(2 * tokens * h * up_w, (tokens * h + h * up_w) * ge + tokens * up_w * e, 1, f8)
    hidden = tokens * f / t
    if gated:
        ac_c, ac_t = mc.vector(VECTOR_FLOPS["swiglu"] * hidden, 3 * hidden * e, 2)
        ac_bt = back(ac_c, 3 * hidden * e, "swiglu", 2)
    else:
        ac_c, ac_t = mc.vector(VECTOR_FLOPS["gelu"] * hidden, 2 * hidden * e, 1)
        ac_bt = back(ac_c, 2 * hidden * e, "gelu", 1)
    dn_c, dn_t = mc.matrix(2 * tokens * f / t * h, (tokens * f / t + f / t * h) * ge + tokens * h * e, 1, f8)
    fwd = fwd + norm_t + up_t + ac_t + dn_t + res_t
    bwd = bwd + norm_bt + 2 * up_t + ac_bt + 2 * dn_t + res_bt
    if fp8:  # ops.fp8_casts of the attention and the MLP block: inputs and weights forward, gradients backward
        per = FP8_CAST_BYTES[c.fp8_recipe]
        qkv_w = (q + 2 * kv) / t
        for block, (forward_elements, backward_elements) in enumerate((
                (tokens * h + h * qkv_w + tokens * q / t + q * h / t, tokens * qkv_w + tokens * h),
                (tokens * h + h * up_w + hidden + f / t * h, tokens * up_w + tokens * h))):
            cast_f = mc.vector(FP8_CAST_FLOPS * forward_elements, per * forward_elements, 4 * FP8_CAST_KERNELS)[1]
            cast_b = mc.vector(FP8_CAST_FLOPS * backward_elements, per * backward_elements, 2 * FP8_CAST_KERNELS)[1]
            fwd, bwd = fwd + cast_f, bwd + cast_b
            if block == 0:  # the attention block's casts belong to MoE layers too
                att_fwd, att_bwd = att_fwd + cast_f, att_bwd + cast_b

    # ---- exposed TP / CP collectives of one layer --------------------------------------------------
    tp_on = t > 1
    # Collective.hides: TP overlap only inside one fast domain (a plain bool when no plan overlaps)
    tp_hides = overlap & (g_tp >= t) if overlap else False
    if overlap:
        sp_fwd = sum(_exposed(rs_block, gemm, tp_hides) for gemm in (qkv_c, out_c, up_c, dn_c))
        sp_bwd = sum(_exposed(rs_block, 2 * gemm, tp_hides) for gemm in (qkv_c, out_c, up_c, dn_c))
        ar_fwd = _exposed(ar_block, out_c, tp_hides) + _exposed(ar_block, dn_c, tp_hides)
        ar_bwd = _exposed(ar_block, 2 * qkv_c, tp_hides) + _exposed(ar_block, 2 * up_c, tp_hides)
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
    emb_fwd_tp = _exposed(emb_comm, emb_c, tp_hides)
    table = vocab * h / t
    _, emb_bt = mc.vector(tokens * h, table * 4 + 2 * tokens * h * e, 2)
    fn_c, fn_t = mc.vector(VECTOR_FLOPS["norm"] * sharded * h, 2 * sharded * h * e, 1)
    fn_bt = back(fn_c, 2 * sharded * h * e, "norm", 1)
    lg_c, lg_t = mc.matrix(2 * tokens * h * vocab / t, (tokens * h + h * vocab / t + tokens * vocab / t) * e, 1)
    head_fwd_tp = np.where(tp_on & sp, _exposed(rs_block, lg_c, tp_hides), 0.0)
    head_bwd_tp = np.where(tp_on, np.where(sp, _exposed(rs_block, 2 * lg_c, tp_hides),
                                           _exposed(ar_block, 2 * lg_c, tp_hides)), 0.0)
    logits = tokens * vocab / t
    upcast = 8.0 if e < 4 else 0.0
    ls_c, ls_t = mc.vector(VECTOR_FLOPS["loss"] * logits, logits * (e + upcast + 8), 3)
    _, ls_bt = mc.vector(2 * VECTOR_FLOPS["loss"] * logits, logits * (8 + (4 + e if e < 4 else 0)), 3)
    loss_comm = np.where(tp_on, _exposed(mc.all_reduce(12.0 * tokens, t, g_tp), ls_c, tp_hides), 0.0)

    # ---- pipeline point-to-point: activations forward, gradients back, once per virtual chunk --------
    p2p_one = np.where(c.pp > 1, mc.p2p(sharded * h * e, layout["pp"] >= c.pp), 0.0)
    p2p_fwd = v * p2p_one
    p2p_bwd = v * p2p_one if backward else zeros

    # ---- parameters per stage (pp = 1: everything on one stage) -----------------------------------
    norm_p = spec.norm_params()
    layer_p = (2 * norm_p + h * (q + 2 * kv) / t + ((q + 2 * kv) / t if spec.attn_bias else 0.0)
               + q * h / t + (h if spec.attn_bias else 0.0) + h * up_w + (up_w if spec.mlp_bias else 0.0)
               + f / t * h + (h if spec.mlp_bias else 0.0))
    emb_p = table + (spec.context_length * h if learned else 0.0)
    head_p = norm_p + (0.0 if spec.tie_embeddings else h * vocab / t)
    head_p_pp = head_p + (table if spec.tie_embeddings else 0.0)  # a tied projection is a copy on the last stage
    single, has_middle = c.pp == 1, c.pp > 2
    # (dense, MoE) blocks of each stage: a MoE model's leading dense blocks sit on the first stage (`stages.py`)
    n_moe, dense_total = spec.moe_layers, spec.n_layers - spec.moe_layers
    n_fold, g_fold = (n_dp * t, g_dp * g_tp) if c.expert_tp == 1 else (n_dp, g_dp)  # EP's ranks, and per domain
    if spec.is_moe:
        first_d = np.minimum(dense_total, first_l)
        counts = {"first": (first_d, first_l - first_d), "mid": (zeros, mid_l), "last": (zeros, last_l)}
        block = moe_block_terms(spec, system, (e, act_precision, c.fp8_recipe if fp8 else None, c.dropout, overlap,
                                               c.expert_imbalance, c.ep_overlap, c.dispatcher, c.expert_tp),
                                c.micro_batch * (seq // c.cp), c.tp, c.ep, g_tp, np.minimum(c.ep, g_fold),
                                c.sequence_parallel)
        # one attention block: its norm, QKV and output projections (the MoE block has its own norm)
        att_p = (norm_p + h * (q + 2 * kv) / t + ((q + 2 * kv) / t if spec.attn_bias else 0.0) + q * h / t
                 + (h if spec.attn_bias else 0.0))
        moe_p, expert_p = att_p + block["params"], block["expert_params"]
        moe_fp8_p = att_p - norm_p + block["fp8_params"]
    else:
        counts = {"first": (first_l, zeros), "mid": (mid_l, zeros), "last": (last_l, zeros)}
        moe_p = expert_p = moe_fp8_p = 0.0

    def stage_p(name: str, extra) -> tuple:
        d, mo = counts[name]
        return layer_p * d + moe_p * mo + extra, expert_p * mo

    (first_p, first_e), (last_p, last_e) = stage_p("first", emb_p), stage_p("last", head_p_pp)
    mid_p, mid_e = stage_p("mid", 0.0)
    mid_p, mid_e = np.where(has_middle, mid_p, 0.0), np.where(has_middle, mid_e, 0.0)
    one_p, one_e = layer_p * dense_total + moe_p * n_moe + emb_p + head_p, expert_p * n_moe
    # the stage with the most parameters: 0 first, 1 middle, 2 last (pp = 1: the single stage, index 0)
    critical = np.argmax(np.stack(np.broadcast_arrays(first_p + first_e, mid_p + mid_e, last_p + last_e)), axis=0)
    critical = np.where(single, 0, critical)
    params = np.where(single, one_p, np.choose(critical, [first_p, mid_p, last_p]))
    experts = np.where(single, one_e, np.choose(critical, np.broadcast_arrays(first_e, mid_e, last_e)))
    names = ("first", "mid", "last")
    critical_dense = np.where(single, dense_total, np.choose(critical, [counts[k][0] for k in names]))
    critical_moe = np.where(single, n_moe, np.choose(critical, [counts[k][1] for k in names]))
    # ZeRO-3 gathers: the linear layers' weights in fp8 where the recipe casts before gathering
    gathered = params * e
    fp8_gather = fp8 and c.fp8_recipe != "blockwise"
    if fp8_gather:
        fp8_p = (layer_p - 2 * norm_p) * critical_dense + moe_fp8_p * critical_moe
        gathered = fp8_p + (params - fp8_p) * e

    # ---- data-parallel collectives: size-based buckets, all-reduce (ZeRO 0) or reduce-scatter --------
    gb = 4 if c.fp32_grads else e
    cap = bucket_cap_MiB * 2**20 / gb
    n_full = np.maximum(0, np.ceil(params / cap) - 1)
    last_bucket = params - n_full * cap
    terms = {"ar_full": mc.all_reduce(cap * gb, n_dp, g_dp), "ar_last": mc.all_reduce(last_bucket * gb, n_dp, g_dp),
             "rs_full": mc.reduce_scatter(cap * gb, n_shard, g_shard),
             "rs_last": mc.reduce_scatter(last_bucket * gb, n_shard, g_shard),
             "hsdp_full": np.where(replicas > 1, mc.all_reduce(cap * gb / n_shard, replicas, g_rep), 0.0),
             "hsdp_last": np.where(replicas > 1, mc.all_reduce(last_bucket * gb / n_shard, replicas, g_rep), 0.0),
             # an all-gather costs as much as a reduce-scatter; ZeRO-3 gathers fp8 weights, ZeRO-1/2 16-bit ones
             "weights_s": mc.reduce_scatter(params * e, n_shard, g_shard),
             "first_bucket": mc.reduce_scatter(np.minimum(params, cap) * e, n_shard, g_shard),
             "weights_s_z3": mc.reduce_scatter(gathered, n_shard, g_shard),
             "first_bucket_z3": mc.reduce_scatter(np.minimum(1.0, cap / params) * gathered, n_shard, g_shard)}
    if spec.is_moe:  # expert gradients (`experts_apart`): reduced and gathered over the `expert_dp` ranks
        terms.update(expert_dp_terms(mc, experts, c.ep.astype(float), n_fold, g_fold, cap, gb, e, fp8_gather))
        terms["weights_s"] = terms["weights_s"] + terms["exp_weights"]
        terms["weights_s_z3"] = terms["weights_s_z3"] + terms["exp_weights_z3"]

    # ---- optimizer over all local parameters, or over a 1/dp shard (ZeRO >= 1) -----------------------
    if mode == "train":
        tensors = (param_tensors(spec, 1, False, False) * critical_dense
                   + np.where(single | (critical == 0), param_tensors(spec, 0, True, False), 0)
                   + np.where(single | (critical == 2), param_tensors(spec, 0, False, True), 0))
        if spec.is_moe:
            tensors = tensors + param_tensors(spec, 0, False, False, 1) * critical_moe
        per_param = optimizer_bytes_per_param(act_precision, gb)
        for name, local in (("opt_full", params + experts),
                            ("opt_sharded", params / n_shard + experts / (n_fold / c.ep))):
            terms[name] = (np.maximum(OPTIMIZER_FLOPS_PER_PARAM * local / mc.optimizer_peak,
                                      local * per_param / mc.bandwidth) + tensors * mc.overhead)
    else:
        terms["opt_full"] = terms["opt_sharded"] = zeros

    # ---- activation bytes per layer and micro-batch of each recompute mode (memory.py) ---------------
    act_f = (2 if gated else 1) * tokens * f / t * e
    common = (2 * sharded * h * e + 2 * sharded * h * ge + tokens * q / t * ge + 2 * sharded * h * mask + act_f
              + tokens * f / t * ge)
    fused = qk_bytes + v_bytes + lse
    s_x_s = scores_el * e + (scores_el * (e + mask) if mask else 0.0)
    per_round = np.where(c.pp > 1, m // c.pipeline_rounds, m)  # a pipeline round holds at most its own
    held_first, held_mid, held_last = (held_micro_batches(c.pp, r, c.interleave, per_round) for r in (0, 1, c.pp - 1))
    # inference keeps only the largest tensor one layer saves (memory.py's forward working set)
    core = np.where(flash, fused, np.maximum.reduce([qk_bytes, v_bytes, scores_el * (e + mask)]))
    terms.update({
        "act_none": common + np.where(flash, fused, qk_bytes + s_x_s + v_bytes),
        "act_selective": common + np.where(flash, fused, qk_bytes + v_bytes),
        "act_full": sharded * h * e,
        "act_forward_only": np.maximum.reduce([sharded * h * e, tokens * q / t * ge, act_f, tokens * f / t * ge,
                                               core]),
        "head_act": tokens * vocab / t * (e + 4 + (4 if e < 4 else 0)), "held_first": held_first,
        "held_mid": held_mid, "held_last": held_last})

    # ---- FLOPs a recomputation repeats (model FLOPs of the layer forward; or the attention core) ------
    layer_flops = 2 * tokens * h * (q + 2 * kv) / t + 2 * tokens * q * h / t + 2 * tokens * h * up_w + 2 * hidden * h
    terms.update({
        "m": m.astype(float), "first_layers": first_l.astype(float), "mid_layers": mid_l.astype(float),
        "last_layers": last_l.astype(float), "mid_dense": counts["mid"][0], "last_dense": counts["last"][0],
        "one_dense": np.full(len(c), float(dense_total)), "one_moe": np.full(len(c), float(n_moe)),
        "has_middle": has_middle, "single": single, "pp": pp, "v": v,
        "dp_cp": n_dp, "shard": n_shard, "replicas": replicas, "layers_total": np.full(len(c), float(spec.n_layers)),
        "gpus": c.gpus.astype(float), "fwd": fwd, "bwd": bwd, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd, "cp_fwd": cp_fwd,
        "cp_bwd": cp_bwd, "sel_fwd": sel_fwd, "sel_cp": sel_cp,
        "first_fwd": emb_t, "first_fwd_tp": emb_fwd_tp, "last_fwd": fn_t + lg_t + ls_t,
        "last_fwd_tp": head_fwd_tp + loss_comm,
        "first_bwd": emb_bt if backward else zeros, "last_bwd": fn_bt + 2 * lg_t + ls_bt if backward else zeros,
        "last_bwd_tp": head_bwd_tp if backward else zeros,
        "p2p_fwd": p2p_fwd, "p2p_bwd": p2p_bwd, "params": params, "n_full": n_full,
        "layer_params": layer_p, "first_params": first_p, "mid_params": mid_p, "last_params": last_p,
        "one_params": one_p, "first_experts": first_e, "mid_experts": mid_e, "last_experts": last_e,
        "one_experts": one_e, "moe_params": moe_p, "expert_params": expert_p, "first_dense": counts["first"][0],
        "first_moe": counts["first"][1],
        "mid_moe": counts["mid"][1], "last_moe": counts["last"][1], "edp": n_fold / c.ep,
        "flops_full": layer_flops + square, "flops_selective": np.where(flash, 0.0, square)})
    if spec.is_moe:  # a MoE layer: the attention block (as above) and the MoE block
        att_tp_fwd, att_tp_bwd = attention_tp(tp_hides, qkv_c, out_c, rs_block, ar_block)
        att_act = sharded * h * e + sharded * h * ge + tokens * q / t * ge + sharded * h * mask
        terms.update({
            "moe_fwd": att_fwd + block["fwd"], "moe_bwd": (att_bwd + block["bwd"]) if backward else zeros,
            "moe_tp_fwd": np.where(tp_on, np.where(sp, att_tp_fwd[0], att_tp_fwd[1]), 0.0) + block["tp_fwd"],
            "moe_tp_bwd": (np.where(tp_on, np.where(sp, att_tp_bwd[0], att_tp_bwd[1]), 0.0) + block["tp_bwd"])
            if backward else zeros,
            "moe_ep_fwd": block["ep_fwd"], "moe_ep_bwd": block["ep_bwd"] if backward else zeros,
            "moe_act_none": att_act + np.where(flash, fused, qk_bytes + s_x_s + v_bytes) + block["saved"],
            "moe_act_selective": att_act + np.where(flash, fused, qk_bytes + v_bytes) + block["saved"],
            "moe_flops_full": 2 * tokens * h * (q + 2 * kv) / t + 2 * tokens * q * h / t + square + block["flops"]})
        terms["act_forward_only"] = np.maximum(terms["act_forward_only"], block["saved_max"])
    return terms
