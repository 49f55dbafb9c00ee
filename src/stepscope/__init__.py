"""stepscope: measure, model and speed up transformer training steps.

The pure-Python vocabulary (`ModelSpec`, `Workload`, presets) is importable without torch; the
measurement side (`stepscope.nn`, `stepscope.measure`, `stepscope.distributed.launch`) imports torch when used.
"""

from stepscope.spec import ModelSpec, Workload, get_preset, list_presets

__version__ = "0.1.0"

__all__ = ["ModelSpec", "Workload", "get_preset", "list_presets", "__version__"]
