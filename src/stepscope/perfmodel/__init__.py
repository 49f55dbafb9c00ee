"""stepscope.perfmodel: an analytical model of transformer training steps (numpy only, never torch).

- `ops`: per-op FLOPs, bytes, saved activations, parameters and collectives of one micro-batch;
- `collectives`, `timing`, `memory`: α–β collectives on two network tiers, roofline op times, pipeline
  bubble and overlap rules, memory by ZeRO stage and recompute mode;
- `evaluate`: one plan, op by op (the reference), and `layers`: its per-layer table;
- `candidates`, `vectorized_terms`, `vectorized`: many plans at once with numpy (tested against `evaluate`);
- `search`: enumerate and rank every valid plan;
- `records`, `nnls`, `calibrate_fit`, `calibrate`, `compare`, `validate`: read stepscope's measured records, fit a
  system to them, put predictions next to measurements, check against published runs;
- the runs behind the commands, each writing its records: `predict.run_predict`, `plan.run_plan`,
  `compare.run_compare`, `validate.run_validate`, `calibrate_run.run_calibrate` (what they share: `runs`).
"""

from stepscope.perfmodel.model.evaluate import Prediction, evaluate

__all__ = ["Prediction", "evaluate"]
