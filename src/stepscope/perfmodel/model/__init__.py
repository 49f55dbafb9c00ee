"""The performance model's formulas, each written once over numpy arrays (one element per plan; one plan is an
array of one): per-op accounting (`ops`, `ops_moe`, `op_types`), op times (`rates`), collectives
(`collectives`), schedules and overlap (`schedule`), where groups sit (`layout`), plans as arrays
(`candidates`), the per-plan terms (`terms`) and the step assembled from them (`step`), the entry points
(`evaluate`), the per-op table (`layers`) and the parameter tensors (`tensors`)."""
