"""Measured next to predicted, where both describe the same configuration:

- a measured `step` and a `predict` record of the same model (every ModelSpec field), batch, sequence,
  precision and mode on one device, whose plan runs as the step did (one GPU, the whole batch in one
  micro-batch, no recomputation, fused attention unless the step's was naive): each phase's median time
  against the predicted time, with the error;
- a measured `comm` point and the α–β fit made from its sweep (same group: backend, op, world size, dtype,
  mode, in place, skew, reduction, source, on the same host; the next such fit in the records, which `comm
  --fit` writes after the points it fitted, also after `--resume`): the time against the fitted
  t(S) = α + factor·S/β;
- a trace against its prediction: `compare --kind trace` records, which hold both sides already (a trace stores no
  model, so nothing else can pair it).

Errors are (predicted − measured) / measured in percent, the sign convention of `stepscope compare`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from stepscope.distributed.collectives.alpha_beta import (
    FIT_GROUP_FIELDS,
    OPTIONAL_GROUP_FIELDS,
    AlphaBetaFit,
    headline_time_us,
)

STEP_PHASES = (("step", "step_ms_median", "step_s", 1000.0), ("forward", "forward_ms_median", "forward_ms", 1.0),
               ("backward", "backward_ms_median", "backward_ms", 1.0),
               ("optimizer", "optimizer_ms_median", "optimizer_ms", 1.0))
"""(phase, measured metric in ms, predicted metric, factor to ms)."""
WORKLOAD_FIELDS = ("batch", "seq", "precision", "mode")


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def _step_key(config: dict[str, Any]) -> str | None:
    spec = config.get("model_spec")
    if not isinstance(spec, dict):
        return None
    spec = {k: v for k, v in spec.items() if k != "name"}  # `--model small --n-layers 2` is the same model
    return json.dumps({"spec": spec, **{f: config.get(f) for f in WORKLOAD_FIELDS}}, sort_keys=True, default=str)


def _runs_as_measured(plan: Any, step_config: dict[str, Any]) -> bool:
    """The prediction's plan is how a single-process `step` runs (`compare.single_process_plan`): the whole
    batch in one micro-batch, no recomputation, fused attention unless the step ran the naive one."""
    if not isinstance(plan, dict):
        return False
    return (plan.get("micro_batch") == step_config.get("batch") and plan.get("recompute", "none") == "none"
            and bool(plan.get("flash_attention", True)) == (step_config.get("attention", "sdpa") != "naive"))


def step_vs_predict(steps: Sequence[dict[str, Any]], predictions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (measured step, one-GPU prediction) pair of the same configuration and plan."""
    predicted: dict[str, list[dict[str, Any]]] = {}
    for record in predictions:
        config = record.get("config") or {}
        key = _step_key(config)
        if record.get("status") == "ok" and key is not None and config.get("gpus") == 1:
            predicted.setdefault(key, []).append(record)
    rows = []
    for step in steps:
        config = step.get("config") or {}
        if step.get("status") != "ok" or not isinstance(step.get("metrics"), dict):
            continue
        for prediction in predicted.get(_step_key(config) or "", []):
            if not _runs_as_measured(prediction["config"].get("plan"), config):
                continue
            row: dict[str, Any] = {"model": config.get("model"), **{f: config.get(f) for f in WORKLOAD_FIELDS},
                                   "device": (step.get("env") or {}).get("device_name"),
                                   "system": prediction["config"].get("system")}
            for phase, measured_name, predicted_name, to_ms in STEP_PHASES:
                measured = step["metrics"].get(measured_name)
                value = prediction["metrics"].get(predicted_name)
                if measured is None or value is None:
                    continue
                row[f"{phase}_measured_ms"] = measured
                row[f"{phase}_predicted_ms"] = value * to_ms
                row[f"{phase}_error_pct"] = error_pct(measured, value * to_ms)
            rows.append(row)
    return rows


def _fit_key(record: dict[str, Any]) -> tuple:
    """The group a fit covers (`alpha_beta.fit_records`'s, skews and seeds apart) on one host. Not the command:
    `comm --resume --fit` fits the points of the interrupted run with its own."""
    config, env = record.get("config") or {}, record.get("env") or {}
    return tuple(str(config.get(f)) for f in FIT_GROUP_FIELDS + OPTIONAL_GROUP_FIELDS) + (str(env.get("hostname")),)


def comm_vs_fit(records: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, AlphaBetaFit]]:
    """One row per measured comm point paired with the fit of its own sweep (the next fit of its group in the
    records: `comm --fit` writes the fit after the points it was made from), and each fit by its label; a
    label seen before gets ` (run 2)`, ` (run 3)`, ... so that reruns stay apart."""
    pending: dict[tuple, list[dict[str, Any]]] = {}
    rows, labelled = [], {}
    for record in records:
        config, metrics = record.get("config") or {}, record.get("metrics") or {}
        if record.get("status") != "ok":
            continue
        if config.get("record") == "point" and headline_time_us(metrics) is not None and "size_bytes" in config:
            pending.setdefault(_fit_key(record), []).append(record)
        elif config.get("record") == "fit" and metrics.get("alpha_us") is not None:
            points = pending.pop(_fit_key(record), [])
            # the fit names how many points it was made from: the latest ones (an earlier run without --fit left
            # points of its own before them)
            points = points[-int(metrics.get("points") or len(points)):]
            if not points:
                continue
            fit = AlphaBetaFit(**{name: metrics.get(name) for name in (
                "alpha_us", "beta_GBps", "bus_factor", "residual_rms_pct", "residual_max_pct", "residual_rms_us",
                "points")})
            label, run = group_label(config), 1
            while (label if run == 1 else f"{label} (run {run})") in labelled:
                run += 1
            label = label if run == 1 else f"{label} (run {run})"
            labelled[label] = fit
            for point in points:
                point_config = point["config"]
                measured = headline_time_us(point["metrics"])
                predicted = fit.predict_us(point_config["size_bytes"])
                rows.append({"group": label, **{f: point_config.get(f) for f in FIT_GROUP_FIELDS},
                             "size_bytes": point_config["size_bytes"], "time_measured_us": measured,
                             "time_fit_us": predicted, "error_pct": error_pct(measured, predicted)})
    return rows, labelled


def group_label(config: dict[str, Any]) -> str:
    """`gloo all_reduce x2 fp32 per-op in-place`: a fit group in a few words (with its skew, reduction and
    source where it has one)."""
    place = "in-place" if config.get("in_place") else "out-of-place"
    extras = [f"skew {config['skew']}" if config.get("skew") is not None else "",
              f"{config['redop']}" if config.get("redop") not in (None, "sum") else "",
              f"from {config['source']}" if config.get("source") else ""]
    return " ".join([f"{config.get('backend')} {config.get('op')} x{config.get('world_size')} {config.get('dtype')} "
                     f"{config.get('mode')} {place}", *[e for e in extras if e]])


def fit_curve(fit: AlphaBetaFit, low: float, high: float, points: int = 24) -> list[tuple[float, float]]:
    """The fitted time at `points` sizes spaced evenly in log between `low` and `high` bytes."""
    if low <= 0 or high <= low:
        return [(low, fit.predict_us(low))]
    step = (math.log10(high) - math.log10(low)) / (points - 1)
    return [(size, fit.predict_us(size)) for size in (10 ** (math.log10(low) + i * step) for i in range(points))]


def trace_vs_predict(compares: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `compare --kind trace` records as rows: rank, model, plan, system and the measured/predicted pairs."""
    rows = []
    for record in compares:
        config = record.get("config") or {}
        if config.get("source") != "trace":
            continue
        plan = config.get("plan") or {}
        rows.append({"rank": config.get("rank"), "model": config.get("model"), "batch": config.get("batch"),
                     "seq": config.get("seq"), "system": config.get("system"),
                     "plan": " ".join(f"{k}{plan.get(k)}" for k in ("dp", "tp", "pp", "cp")),
                     **(record.get("metrics") or {})})
    return rows
