"""The published-peaks table: every row parses, names match first-wins, precision picks the column."""

import pytest

from stepscope.measure.peaks import accelerator_peaks, published_peak


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
