"""The model against published measured runs (Narayanan et al. 2021, Table 1), from first principles."""

from stepscope.perfmodel.validate import load_dataset, median_abs_error, validate


def test_shipped_dataset_matches_the_paper_and_its_assumptions():
    runs = load_dataset()
    assert len(runs) == 10 and runs[-1].plan.gpus == 3072
    for run in runs:
        assert run.plan.gpus == run.plan.dp * run.plan.tp * run.plan.pp
        assert run.plan.micro_batch == 1 and run.plan.interleave == 1 and run.plan.recompute == "full"
        # the shipped iteration time is the paper's FLOP count over its TFLOP/s
        derived = run.published_flops / (run.measured_tflops_per_gpu * 1e12 * run.plan.gpus)
        assert abs(derived - run.measured_step_s) / run.measured_step_s < 0.01
    assert abs(runs[0].model.param_count() / 1e9 - 1.7) < 0.1  # 1.65B with embeddings, rounded to 1.7B


def test_median_absolute_error_on_the_published_runs_is_at_most_15_percent():
    rows = validate()
    assert median_abs_error(rows) <= 0.15
    assert all(0 < r.prediction.mfu_pct < 100 and r.prediction.memory.feasible for r in rows)
