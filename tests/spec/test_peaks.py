"""The published-peaks table: every row parses, names match first-wins, precision picks the column; the system presets
take their matrix peaks from it (one source)."""

from importlib import resources

import pytest

from stepscope.errors import UsageError
from stepscope.spec.peaks import accelerator_peaks, published_matrix_TFLOPps, published_peak
from stepscope.spec.system import list_systems, load_system, parse_system_toml, system_to_toml, tomllib


def test_every_row_has_positive_rates_and_a_source():
    rows = accelerator_peaks()
    assert len(rows) >= 10
    for row in rows:
        assert row["source"].strip(), row
        for column in ("half_TFLOPps", "tf32_TFLOPps", "fp32_TFLOPps"):
            assert float(row[column]) > 0, row
        # tensor-core half precision is never slower than fp32 on these parts
        assert float(row["half_TFLOPps"]) >= float(row["fp32_TFLOPps"]), row


def test_device_names_match_the_specific_row_before_the_general_one():
    assert published_peak("NVIDIA H100 PCIe", "bf16", tf32=False) == pytest.approx(756e12)
    assert published_peak("NVIDIA H100 80GB HBM3", "bf16", tf32=False) == pytest.approx(989e12)
    assert published_peak("NVIDIA A10G", "fp16", tf32=False) == pytest.approx(70e12)
    # whole words: an L40 is no L4, an H100 NVL no H100 SXM
    assert published_peak("NVIDIA L40", "bf16", tf32=False) == pytest.approx(181e12)
    assert published_peak("NVIDIA L4", "bf16", tf32=False) == pytest.approx(121e12)
    assert published_peak("NVIDIA H100 NVL", "bf16", tf32=False) == pytest.approx(835e12)
    assert published_peak("NVIDIA GH200 480GB", "bf16", tf32=False) == pytest.approx(989e12)
    assert published_peak("NVIDIA GB200", "bf16", tf32=False) == pytest.approx(2500e12)


def test_fp32_uses_the_tf32_peak_only_when_tf32_is_allowed():
    assert published_peak("NVIDIA A100-SXM4-80GB", "fp32", tf32=True) == pytest.approx(156e12)
    assert published_peak("NVIDIA A100-SXM4-80GB", "fp32", tf32=False) == pytest.approx(19.5e12)


def test_unknown_devices_have_no_peak():
    assert published_peak("Some Future GPU", "bf16", tf32=True) is None


def test_the_presets_take_their_matrix_peaks_from_the_table():
    """One source: a preset of a listed accelerator states no matrix peak of its own and gets the row's, exactly."""
    listed = 0
    for name in list_systems():
        text = resources.files("stepscope").joinpath(f"data/systems/{name}.toml").read_text()
        accelerator = tomllib.loads(text)["accelerator"]
        published = published_matrix_TFLOPps(accelerator["name"])
        if published is None:  # a CPU: measured rates, in its file
            assert "matrix_TFLOPps" in accelerator, name
            continue
        listed += 1
        assert "matrix_TFLOPps" not in accelerator, f"{name} restates the published peaks"
        assert load_system(name).accelerator.matrix_TFLOPps == published, name
    assert listed >= 8
    h100 = load_system("H100-SXM").accelerator.matrix_TFLOPps
    assert h100 == {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0, "fp8": 1979.0}
    assert "fp8" not in load_system("A100-80GB").accelerator.matrix_TFLOPps  # an empty cell: no such rate


def test_a_system_of_an_unlisted_accelerator_must_state_its_peaks():
    text = system_to_toml(load_system("H100-SXM")).replace("NVIDIA H100 80GB HBM3", "Some Future GPU")
    lines = [line for line in text.splitlines() if not line.startswith("matrix_TFLOPps")]
    with pytest.raises(UsageError, match="missing key 'matrix_TFLOPps'.*no published peaks for 'Some Future GPU'"):
        parse_system_toml("\n".join(lines))
    assert parse_system_toml(text).accelerator.matrix_TFLOPps["bf16"] == 989.0  # stated: its own
