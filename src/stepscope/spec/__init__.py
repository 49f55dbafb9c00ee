"""The shared vocabulary, pure Python (no torch): `ModelSpec` and its presets, `Workload`, `SystemSpec` (system),
`ParallelPlan` (plan), and the gradient-bucket planner (buckets) that the DDP wrappers and the performance model
share. May import: errors."""

from stepscope.spec.model import ModelSpec, field_names
from stepscope.spec.overrides import parse_field_value
from stepscope.spec.presets import PRESETS, get_preset, list_presets
from stepscope.spec.workload import (
    MODELLED_PRECISIONS,
    MODES,
    PRECISIONS,
    Workload,
    bytes_per_element,
)

__all__ = ["ModelSpec", "Workload", "PRESETS", "MODES", "PRECISIONS", "MODELLED_PRECISIONS", "get_preset",
           "list_presets", "field_names", "parse_field_value", "bytes_per_element"]
