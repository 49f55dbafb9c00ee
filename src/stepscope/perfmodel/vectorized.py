"""Evaluate many plans at once with numpy: the same model as `evaluate.py`, written over arrays.

`evaluate_many(spec, workload, system, candidates)` returns every output of the reference evaluation
(step time, phases, breakdown, MFU, memory, feasibility) as arrays, one element per plan. It works in two
levels: `vectorized_terms.group_terms` computes everything that does not depend on the ZeRO stage or the
recompute mode; this file assembles the pipeline stages, the data-parallel exposure, the optimizer and the
memory for each candidate. With `group_size=k` the caller promises that each run of k consecutive
candidates differs only in ZeRO stage and recompute mode (what a search produces): the group terms are
then computed once per run and broadcast, which is what makes a search evaluate millions of plans per
second. `tests/perfmodel/test_vectorized.py` checks both ways against the op-by-op reference.
"""

from __future__ import annotations

import numpy as np

from stepscope.perfmodel.candidates import Candidates
from stepscope.perfmodel.machine import Machine
from stepscope.perfmodel.ops import activation_precision
from stepscope.perfmodel.timing import DEFAULT_BUCKET_MIB, gradient_reductions, zero3_gathers
from stepscope.perfmodel.vectorized_terms import group_terms
from stepscope.spec import ModelSpec, Workload, bytes_per_element
from stepscope.spec.system import SystemSpec

GiB = 2.0**30


def evaluate_many(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates, *, group_size: int = 1,
                  bucket_cap_MiB: float = DEFAULT_BUCKET_MIB) -> dict[str, np.ndarray]:
    """Every output of `evaluate.evaluate` for every candidate (arrays, one element per plan)."""
    n = len(c)
    if n % group_size:
        raise ValueError(f"{n} candidates do not split into groups of {group_size}")
    representatives = c if group_size == 1 else c.subset(slice(None, None, group_size))
    terms = group_terms(spec, workload, system, representatives, bucket_cap_MiB)
    zero, rec = c.zero.reshape(-1, group_size), c.recompute.reshape(-1, group_size)
    grid = _member_grid(zero, rec)
    if grid is None:  # groups on axis 0, the members of a group (ZeRO stage x recompute mode) on axis 1
        T = {name: np.reshape(value, (-1, 1)) for name, value in terms.items()}
        shape = zero.shape
    else:  # groups on axis 0, ZeRO stages on axis 1, recompute modes on axis 2
        T = {name: np.reshape(value, (-1, 1, 1)) for name, value in terms.items()}
        zero, rec = grid
        shape = (len(representatives), zero.shape[1], rec.shape[2])
    out = _assemble(spec, workload, system, c, T, zero, rec)
    return {name: np.broadcast_to(value, shape).reshape(n) for name, value in out.items()}


def _member_grid(zero: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where every group's members are the same ZeRO stages x recompute modes, the recompute mode varying
    fastest (what a search produces): the stages as a (1, z, 1) array and the modes as (1, 1, r), else None.
    Broadcasting then computes what depends on the recompute mode alone (the pipeline stages and their pace)
    once per mode instead of once per member, and what depends on neither once per group; every element is
    still the same float operations on the same values, so the outputs are identical."""
    first_z, first_r = zero[0], rec[0]
    if not ((zero == first_z).all() and (rec == first_r).all()):
        return None
    modes = int(np.argmax(first_z != first_z[0])) or len(first_z)  # members before the stage first changes
    if len(first_z) % modes:
        return None
    z, r = first_z.reshape(-1, modes), first_r.reshape(-1, modes)
    if not ((z == z[:, :1]).all() and (r == r[:1]).all()):
        return None
    return z[:, 0].reshape(1, -1, 1), r[0].reshape(1, 1, -1)


def _assemble(spec: ModelSpec, workload: Workload, system: SystemSpec, c: Candidates, T: dict[str, np.ndarray],
              zero: np.ndarray, rec: np.ndarray) -> dict[str, np.ndarray]:
    mode, seq = workload.mode, workload.seq
    backward = mode != "fwd"
    act = activation_precision(workload.precision)
    mc = Machine.of(system, act)  # MFU against the 16-bit peak, fp8 runs included
    e = bytes_per_element(act)
    m, single = T["m"], T["single"]

    # ---- recomputation re-runs the layer forward (full) or the unfused attention core (selective) -----
    moe = "moe_fwd" in T  # a Mixture-of-Experts model: MoE layers beside the dense ones
    zero_s = np.zeros(rec.shape)
    if backward:
        rec_compute = np.where(rec == 2, T["fwd"], np.where(rec == 1, T["sel_fwd"], 0.0))
        rec_tp = np.where(rec == 2, T["tp_fwd"], 0.0)
        rec_cp = np.where(rec == 2, T["cp_fwd"], np.where(rec == 1, T["sel_cp"], 0.0))
        if moe:
            moe_rec = np.where(rec == 2, T["moe_fwd"], np.where(rec == 1, T["sel_fwd"], 0.0))
            moe_rec_tp = np.where(rec == 2, T["moe_tp_fwd"], 0.0)
            moe_rec_ep = np.where(rec == 2, T["moe_ep_fwd"], 0.0)
    else:
        rec_compute = rec_tp = rec_cp = moe_rec = moe_rec_tp = moe_rec_ep = zero_s

    # ---- pipeline stages, per micro-batch: (compute, tp, cp, ep) forward and backward ----------------
    lf = (T["fwd"], T["tp_fwd"], T["cp_fwd"])
    lb = (T["bwd"] + rec_compute, T["tp_bwd"] + rec_tp, T["cp_bwd"] + rec_cp)
    if moe:
        mf = (T["moe_fwd"], T["moe_tp_fwd"], T["cp_fwd"], T["moe_ep_fwd"])
        mb = (T["moe_bwd"] + moe_rec, T["moe_tp_bwd"] + moe_rec_tp, T["cp_bwd"] + rec_cp, T["moe_ep_bwd"] + moe_rec_ep)

    def stage(extra_f, extra_b, dense, experts):
        if not moe:
            return ((lf[0] * dense + extra_f[0], lf[1] * dense + extra_f[1], lf[2] * dense),
                    (lb[0] * dense + extra_b[0], lb[1] * dense + extra_b[1], lb[2] * dense))
        return ((lf[0] * dense + mf[0] * experts + extra_f[0], lf[1] * dense + mf[1] * experts + extra_f[1],
                 lf[2] * dense + mf[2] * experts, mf[3] * experts),
                (lb[0] * dense + mb[0] * experts + extra_b[0], lb[1] * dense + mb[1] * experts + extra_b[1],
                 lb[2] * dense + mb[2] * experts, mb[3] * experts))

    first_f, last_f = (T["first_fwd"], T["first_fwd_tp"]), (T["last_fwd"], T["last_fwd_tp"])
    first_b, last_b = (T["first_bwd"], 0.0), (T["last_bwd"], T["last_bwd_tp"])
    one = stage((first_f[0] + last_f[0], first_f[1] + last_f[1]), (first_b[0] + last_b[0], first_b[1] + last_b[1]),
                T["one_dense"], T["one_moe"])
    # pipeline stages (evaluate's `pipeline_stages`): first (embedding), middle (pp > 2), last (head); the
    # slowest sets the pace (a middle stage where pp <= 2 does not exist: it never wins)
    counts = [(T["first_dense"], T["first_moe"]), (T["mid_dense"], T["mid_moe"]), (T["last_dense"], T["last_moe"])]
    staged = [stage(first_f, first_b, *counts[0]), stage((0.0, 0.0), (0.0, 0.0), *counts[1]),
              stage(last_f, last_b, *counts[2])]
    totals = [sum(f) + sum(b) for f, b in staged]
    totals[1] = np.where(T["has_middle"], totals[1], -np.inf)
    pace = np.where(single, 0, np.argmax(np.stack(np.broadcast_arrays(*totals)), axis=0))
    parts = 4 if moe else 3  # (compute, tp, cp[, ep])
    at = (pace == 0, pace == 1)
    sf = [np.where(single, one[0][i], _by_stage(at, [s[0][i] for s in staged])) for i in range(parts)]
    sb = [np.where(single, one[1][i], _by_stage(at, [s[1][i] for s in staged])) for i in range(parts)]
    stage_fwd, stage_bwd = sf[0] + sf[1] + sf[2], sb[0] + sb[1] + sb[2]
    if moe:
        stage_fwd, stage_bwd = stage_fwd + sf[3], stage_bwd + sb[3]
    else:  # a dense model exchanges no tokens
        sf.append(zero_s)
        sb.append(zero_s)

    def at_pace(one_value, values):
        return np.where(single, one_value, _by_stage(at, values))

    stage_rec = rec_compute * at_pace(T["one_dense"], [c[0] for c in counts])
    if moe:
        stage_rec = stage_rec + moe_rec * at_pace(T["one_moe"], [c[1] for c in counts])
    p2p_fwd, p2p_bwd = T["p2p_fwd"], T["p2p_bwd"]

    # ---- data parallelism: reduction (overlapped except the last bucket), ZeRO parameter gathers ------
    is_ar = zero == 0
    full_t = np.where(is_ar, T["ar_full"], T["rs_full"])
    last_t = np.where(is_ar, T["ar_last"], T["rs_last"])
    total_t = T["n_full"] * full_t + last_t
    if moe:  # expert gradients (`experts_apart`), launched before the others
        total_t = total_t + np.where(is_ar, T["ar_exp"], T["rs_exp"])
    reduce_s = np.maximum(total_t - stage_bwd, last_t) if c.dp_overlap else total_t
    reduce_s = gradient_reductions(T["pp"], c.pipeline_rounds, zero, m) * reduce_s
    # HSDP: the reduced gradient shards all-reduced across the replicas, once a step
    hsdp_t = T["n_full"] * T["hsdp_full"] + T["hsdp_last"]
    hsdp_s = np.maximum(hsdp_t - stage_bwd, T["hsdp_last"]) if c.dp_overlap else hsdp_t
    reduce_s = reduce_s + np.where((zero >= 1) & (T["replicas"] > 1), np.where(single, 1, c.pipeline_rounds) * hsdp_s,
                                   0.0)
    weights_s, first_bucket = T["weights_s"], T["first_bucket"]
    weights3, first3 = T["weights_s_z3"], T["first_bucket_z3"]
    # ZeRO-3: `timing.zero3_gathers` forward and backward gathers, each behind its pass but for the first bucket
    forwards, backwards = zero3_gathers(T["pp"], c.pipeline_rounds, m, backward, c.reshard_after_forward)
    if c.dp_overlap:
        z3 = (forwards * np.maximum(weights3 - stage_fwd, first3)
              + backwards * np.maximum(weights3 - stage_bwd, first3))
        z12 = np.maximum(weights_s - stage_fwd, first_bucket)
    else:
        z3, z12 = (forwards + backwards) * weights3, weights_s
    # expert weights with a group of their own may need it where dp x cp = 1 (whole experts on every TP rank);
    # gradients are reduced where there is a backward pass, ZeRO-3 gathers its weights for forward as well
    has_dp = (T["dp_cp"] > 1) | ((T["edp"] > 1) if moe else False)
    reduce_s = np.where(has_dp & backward, reduce_s, 0.0)
    gather_s = np.where(has_dp & (zero == 3), z3, np.where(has_dp & (zero >= 1) & (mode == "train"), z12, 0.0))
    optimizer_s = np.where(zero >= 1, T["opt_sharded"], T["opt_full"])

    # ---- phases and breakdown ---------------------------------------------------------------------------
    bubble_s = c.pipeline_rounds * (T["pp"] - 1) / T["v"] * (stage_fwd + stage_bwd + p2p_fwd + p2p_bwd)
    z3_mask = zero == 3
    z3_gathers = np.where(z3_mask, gather_s, 0.0)  # in the backward phase, or forward's without one
    out = {"forward_ms": 1e3 * (m * (stage_fwd + p2p_fwd) + (0.0 if backward else z3_gathers)),
           "backward_ms": 1e3 * (m * (stage_bwd + p2p_bwd) + reduce_s + (z3_gathers if backward else 0.0)),
           "optimizer_ms": 1e3 * (optimizer_s + np.where(z3_mask, 0.0, gather_s)),
           "bubble_ms": 1e3 * bubble_s,
           "forward_compute_s": m * sf[0], "backward_compute_s": m * (sb[0] - stage_rec),
           "recompute_s": m * stage_rec, "tp_comm_s": m * (sf[1] + sb[1]), "cp_comm_s": m * (sf[2] + sb[2]),
           "ep_comm_s": m * (sf[3] + sb[3]),
           "pp_comm_s": m * (p2p_fwd + p2p_bwd), "bubble_s": bubble_s, "dp_comm_s": reduce_s + gather_s,
           "optimizer_s": optimizer_s}
    step = (out["forward_ms"] + out["backward_ms"] + out["optimizer_ms"] + out["bubble_ms"]) / 1e3
    out["step_s"] = step
    out["tokens_per_s"] = workload.batch * seq / step
    model_flops = workload.batch * seq * (spec.flops_per_token(seq) if backward else spec.forward_flops_per_token(seq))
    recomputed = np.where(rec == 2, T["flops_full"], np.where(rec == 1, T["flops_selective"], 0.0))
    if moe:
        moe_recomputed = np.where(rec == 2, T["moe_flops_full"], np.where(rec == 1, T["flops_selective"], 0.0))
        recomputed = (recomputed * T["one_dense"] + moe_recomputed * T["one_moe"]) / T["layers_total"]
    hardware_flops = model_flops + (recomputed * T["layers_total"] / T["pp"] * m * T["gpus"] if backward else 0.0)
    out["mfu_pct"] = 100 * model_flops / (step * T["gpus"] * mc.peak)
    out["hfu_pct"] = 100 * hardware_flops / (step * T["gpus"] * mc.peak)
    out.update(_memory(workload, system, c, T, zero, rec, e))
    return out


def _by_stage(at: tuple[np.ndarray, np.ndarray], values: list) -> np.ndarray:
    """The first, middle or last stage's value where `at` = (index == 0, index == 1) of a stage index: what
    np.choose gives, by two wheres, which take the values broadcast (choose needs them copied to full size
    first, and measured slower)."""
    return np.where(at[0], values[0], np.where(at[1], values[1], values[2]))


def _memory(workload: Workload, system: SystemSpec, c: Candidates, T: dict[str, np.ndarray], zero: np.ndarray,
            rec: np.ndarray, e: int) -> dict[str, np.ndarray]:
    """memory.py over arrays: state bytes by ZeRO stage and shard group, activations by recompute mode and
    micro-batches in flight, the fullest of the first, middle and last stage."""
    n_shard, single = T["shard"], T["single"]
    gb = 4 if c.fp32_grads else e
    optimizer_bytes = 8.0 + (4.0 if workload.precision != "fp32" else 0.0)  # m, v (+ fp32 master weights)
    keeps = (zero == 3) & (not c.reshard_after_forward)  # FSDP without resharding holds the gathered weights
    # under a pipeline schedule FSDP keeps unsharded gradients and gathered weights through a round (memory.py)
    through = (~single) & (workload.mode != "fwd")
    keeps = keeps | ((zero == 3) & through)
    w = np.where((zero >= 3) & ~keeps, e / n_shard, float(e))
    g = np.where((zero >= 2) & ~through, gb / n_shard, float(gb))
    o = np.where(zero >= 1, optimizer_bytes / n_shard, optimizer_bytes)
    moe = "moe_fwd" in T
    if moe:  # expert weights (`experts_apart`): state sharded over the `expert_dp` ranks holding the same experts
        n_edp = T["edp"]
        we = np.where((zero >= 3) & ~keeps, e / n_edp, float(e))
        ge = np.where((zero >= 2) & ~through, gb / n_edp, float(gb))
        oe = np.where(zero >= 1, optimizer_bytes / n_edp, optimizer_bytes)

    def per_layer_of(prefix: str) -> np.ndarray:
        return np.where(rec == 2, T["act_full"], np.where(rec == 1, T[f"{prefix}act_selective"],
                                                          T[f"{prefix}act_none"]))

    per_layer = per_layer_of("")
    per_moe = per_layer_of("moe_") if moe else 0.0
    full_working = np.maximum(T["act_none"], T["moe_act_none"]) if moe else T["act_none"]
    largest_layer = np.maximum(T["layer_params"], T["moe_params"] + T["expert_params"]) if moe else T["layer_params"]
    gathered = np.where((zero >= 3) & ~keeps, 2 * largest_layer * e, 0.0)  # ZeRO-3: the layer and the prefetched one
    working = np.where(rec == 2, full_working, 0.0) + gathered
    head_act = T["head_act"]
    per_param = w + g + o

    def acts(dense, experts, held):
        return (per_layer * dense + per_moe * experts) * held if moe else per_layer * dense * held

    one = (T["one_params"], T["one_experts"], acts(T["one_dense"], T["one_moe"], np.minimum(1.0, T["m"])) + working
           + head_act)
    stages = [(T["first_params"], T["first_experts"], acts(T["first_dense"], T["first_moe"], T["held_first"])
               + working),
              (T["mid_params"], T["mid_experts"], acts(T["mid_dense"], T["mid_moe"], T["held_mid"]) + working),
              (T["last_params"], T["last_experts"], acts(T["last_dense"], T["last_moe"], T["held_last"]) + working
               + head_act)]
    totals = ([p * per_param + x * (we + ge + oe) + a for p, x, a in stages] if moe
              else [p * per_param + a for p, _, a in stages])
    totals[1] = np.where(T["has_middle"], totals[1], -np.inf)
    fullest = np.argmax(np.stack(np.broadcast_arrays(*totals)), axis=0)
    at = (fullest == 0, fullest == 1)

    def pick(i: int) -> np.ndarray:
        return np.where(single, one[i], _by_stage(at, [s[i] for s in stages]))

    params, activations = pick(0), pick(2)
    weights, grads, optimizer = params * w, params * g, params * o
    if moe:
        experts = pick(1)
        weights, grads, optimizer = weights + experts * we, grads + experts * ge, optimizer + experts * oe
    if workload.mode != "train":
        optimizer = np.zeros(optimizer.shape)
        if workload.mode == "fwd":
            grads = np.zeros(grads.shape)
            activations = np.broadcast_to(T["act_forward_only"] + gathered, weights.shape)
    total = weights + grads + optimizer + activations
    capacity = system.accelerator.capacity_bytes
    return {"weights_GiB": weights / GiB, "grads_GiB": grads / GiB, "optimizer_GiB": optimizer / GiB,
            "activations_GiB": activations / GiB, "mem_GiB": total / GiB,
            "capacity_GiB": np.full(total.shape, capacity / GiB), "feasible": total <= capacity}
