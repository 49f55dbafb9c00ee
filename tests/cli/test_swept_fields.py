"""A swept model field shows: in each point's title and as a column of the sweep summary, so the points of
`stepscope step --model small --n-layers 2,4` do not print alike."""

from stepscope.cli.output import model_label, overridden_fields, point_fields, point_title, summary_columns
from stepscope.cli.step import SUMMARY_COLUMNS
from stepscope.measure.step.config import StepConfig
from stepscope.spec import Workload, get_preset


def test_titles_name_the_fields_a_point_overrides():
    two, four = (StepConfig(model=get_preset("small", n_layers=n), workload=Workload(batch=4, seq=128))
                 for n in (2, 4))
    assert point_title(two) != point_title(four)
    assert point_title(two).startswith("small n_layers 2 batch 4 seq 128")
    assert model_label(get_preset("small")) == "small" and overridden_fields(get_preset("small")) == {}
    assert overridden_fields(get_preset("small", n_layers=2, context_length=512)) == {"context_length": 512,
                                                                                  "n_layers": 2}
    assert point_fields(four)["n_layers"] == 4  # csv and json: a column


def test_the_summary_shows_the_swept_field_after_the_model():
    rows = [{"model": "small", "n_layers": n, "d_model": 768, "batch": 4, "status": "ok", "step_ms_median": m}
            for n, m in ((2, 10.0), (4, 19.5))]
    columns = summary_columns(rows, SUMMARY_COLUMNS)
    assert columns[:3] == ["model", "n_layers", "batch"]  # d_model is the same everywhere: not shown
    assert "d_model" not in columns and "step_ms_median" in columns
    assert summary_columns(rows[:1], SUMMARY_COLUMNS)[:2] == ["model", "batch"]
