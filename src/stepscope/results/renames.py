"""Record fields under an earlier name or unit, read under today's: records written before a field was renamed (one
unit per quantity, docs/vocabulary.md) still read, compare, calibrate and report. `read_records` applies
`upgrade` to every record it returns; nothing is rewritten on disk."""

from __future__ import annotations

from typing import Any

RENAMED = {"gflop": "GFLOP", "bucket_mb": "bucket_MiB", "link_gbps": "link_Gbps", "tflops": "TFLOPps", "gbps": "GBps",
           "gflop_per_call": "GFLOP_per_call", "intensity_flop_per_byte": "intensity_FLOP_per_byte",
           "intensity_FLOP_per_B": "intensity_FLOP_per_byte", "flop_per_byte": "FLOP_per_byte",
           "tflops_per_gpu": "TFLOPps_per_gpu", "measured_tflops_per_gpu": "measured_TFLOPps_per_gpu",
           "predicted_tflops_per_gpu": "predicted_TFLOPps_per_gpu", "size_B": "size_bytes", "sent_B": "sent_bytes",
           "cma_B": "cma_bytes", "mapped_B": "mapped_bytes",
           "switch_mpps": "switch_Mpps", "worker_mpps": "worker_Mpps"}
"""Old name -> today's, the value unchanged."""
RESIZED = {"gbyte": ("bytes", 1e9)}
"""Old name -> (today's, the factor its value takes)."""
RESCALED = (("GFLOPps", "TFLOPps", 1e-3), ("Gbps", "GBps", 1 / 8))
"""(old unit, today's, factor): a field named `<x>_<old unit>` (or the unit alone) is now `<x>_<today's>`, its
value times the factor (GFLOP/s -> TFLOP/s; gigabits -> gigabytes per second). `link_Gbps`, a link's line rate,
stays in bits."""
VALUES = {("innet-bench", "dtype"): {"f32": "fp32", "i32": "int32"}}
"""(record kind, config field) -> old value -> today's."""


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its config and metrics under today's names and units (the same object, changed in place)."""
    for section in ("config", "metrics"):
        if isinstance(record.get(section), dict):
            record[section] = _upgrade_table(record[section])
    config = record.get("config")
    for (kind, field), values in VALUES.items():
        if record.get("kind") == kind and isinstance(config, dict) and config.get(field) in values:
            config[field] = values[config[field]]
    return record


def upgraded_name(name: str) -> tuple[str, float]:
    """Today's name of field `name`, and the factor its value takes (1: the same value)."""
    if name in RENAMED:
        return RENAMED[name], 1.0
    if name in RESIZED:
        return RESIZED[name]
    for old, new, factor in RESCALED:
        if (name == old or name.endswith("_" + old)) and name != "link_Gbps":
            return name[: -len(old)] + new, factor
    return name, 1.0


def _upgrade_table(table: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in table.items():
        new, factor = upgraded_name(name)
        if factor != 1.0 and isinstance(value, int | float) and not isinstance(value, bool):
            value = value * factor
        out[new] = _upgrade_value(value)
    return out


def _upgrade_value(value: Any) -> Any:
    if isinstance(value, dict):
        return _upgrade_table(value)
    if isinstance(value, list):
        return [_upgrade_value(v) for v in value]
    return value
