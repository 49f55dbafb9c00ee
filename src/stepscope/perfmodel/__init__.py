"""stepscope.perfmodel: an analytical model of transformer training steps (numpy only, never torch).

- `model`: every cost written once over numpy arrays (one plan = an array of one): per-op accounting, op times,
  collectives, schedules, where groups sit, the step, `evaluate` / `evaluate_many`, the per-layer table;
- `search`: enumerate every valid plan in chunks on worker processes, keep the top k;
- `calibrate`: fit a system or a stack to measured records, published runs, op rates or traces;
- `validate`: put predictions next to measured records and traces (`compare`), check them against published runs;
- `records`: read stepscope's measured records; `runs`: what the run_* functions share;
- the runs behind the commands, each writing its records: `predict.run_predict`, `plan.run_plan`,
  `validate.compare.run_compare`, `validate.validate.run_validate`, `calibrate.run.run_calibrate`.

How the model prices a step: docs/model.md; the commands: docs/perfmodel.md; its accuracy: docs/validation.md.
"""

from stepscope.perfmodel.model.evaluate import Prediction, evaluate

__all__ = ["Prediction", "evaluate"]
