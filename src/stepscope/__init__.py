"""stepscope: measure, model and speed up transformer training steps.

Every command is one library function, and the same call from Python writes the same records:

    import stepscope
    spec = stepscope.get_preset("small", n_layers=2)
    stepscope.run_step_sweep([stepscope.StepConfig(model=spec, iters=5)], "stepscope-results")

The pure-Python vocabulary (`ModelSpec`, `Workload`, presets) is imported at once; everything else on first
use, so `import stepscope` stays light (no torch until a measurement needs it).
"""

from __future__ import annotations

import importlib
from typing import Any

from stepscope.spec import ModelSpec, Workload, get_preset, list_presets

__version__ = "0.1.0"

# exported name -> its module, or (module, name there) where two packages use the same name
_API: dict[str, str | tuple[str, str]] = {
    # measure: one training step and what is measured of it
    "StepConfig": "stepscope.measure.step.config", "run_step_sweep": "stepscope.measure.step.benchmark",
    "run_step_ab": "stepscope.measure.step.ab",
    "MoEDenseConfig": "stepscope.measure.moe.config", "run_moe_vs_dense": "stepscope.measure.moe.benchmark",
    "ProfileConfig": "stepscope.measure.profile.config", "run_profile_sweep": "stepscope.measure.profile.benchmark",
    "MemoryConfig": "stepscope.measure.memory.config", "run_memory_sweep": "stepscope.measure.memory.benchmark",
    "AttentionBenchConfig": "stepscope.measure.attention.config",
    "run_attention_sweep": "stepscope.measure.attention.benchmark",
    "OpRatesConfig": "stepscope.measure.op_rates.config", "run_op_rates": "stepscope.measure.op_rates.benchmark",
    "AccumulateConfig": "stepscope.measure.precision.config", "DtypesConfig": "stepscope.measure.precision.config",
    "run_accumulate": "stepscope.measure.precision.experiments",
    "run_dtypes": "stepscope.measure.precision.experiments",
    # communicate: collectives, data parallelism
    "CommConfig": "stepscope.distributed.collectives.config", "run_comm": "stepscope.distributed.collectives.session",
    "import_comm": "stepscope.distributed.collectives.session",
    "DDPBenchConfig": "stepscope.distributed.data_parallel.bench_config",
    "run_ddp_sweep": "stepscope.distributed.data_parallel.benchmark",
    "EPConfig": "stepscope.distributed.expert_parallel.config",
    "run_moe_ep": "stepscope.distributed.expert_parallel.benchmark",
    # predict: the performance model
    "ParallelPlan": "stepscope.spec.plan", "load_system": "stepscope.spec.system",
    "PredictConfig": "stepscope.perfmodel.predict", "PredictPoint": "stepscope.perfmodel.predict",
    "run_predict": "stepscope.perfmodel.predict", "evaluate": "stepscope.perfmodel.model.evaluate",
    "PlanConfig": "stepscope.perfmodel.plan", "run_plan": "stepscope.perfmodel.plan",
    "CompareConfig": "stepscope.perfmodel.validate.compare", "run_compare": "stepscope.perfmodel.validate.compare",
    "ValidateConfig": "stepscope.perfmodel.validate.validate", "run_validate": "stepscope.perfmodel.validate.validate",
    "CalibrateConfig": "stepscope.perfmodel.calibrate.run", "run_calibrate": "stepscope.perfmodel.calibrate.run",
    # analyse: PyTorch profiler traces of real runs
    "TraceConfig": "stepscope.traces.config", "run_trace": "stepscope.traces.run",
    "run_trace_tally": "stepscope.traces.tally",
    # in-network aggregation (`stepscope innet ...`): the innet names say so, as `ProfileConfig` is taken
    "InnetBenchConfig": ("stepscope.innet.runs.bench", "BenchConfig"),
    "run_innet_bench": ("stepscope.innet.runs.bench", "run_bench"),
    "InnetTrainConfig": ("stepscope.innet.runs.train", "TrainConfig"),
    "run_innet_train": ("stepscope.innet.runs.train", "run_train"),
    "InnetProfileConfig": ("stepscope.innet.runs.timeout_profile", "ProfileConfig"),
    "run_innet_timeout_profile": ("stepscope.innet.runs.timeout_profile", "run_profile"),
    "SimConfig": "stepscope.innet.sim.config", "run_innet_simulate": ("stepscope.innet.sim.sweep", "run_simulate"),
    "SwitchConfig": "stepscope.innet.switch.config",
    # report: one HTML page of a study
    "build_report": ("stepscope.report", "build"), "write_report": "stepscope.report",
}

__all__ = ["ModelSpec", "Workload", "get_preset", "list_presets", "__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        module, attribute = _API[name] if isinstance(_API[name], tuple) else (_API[name], name)
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
