"""`calibrate --rates`: a system from measured op rates, by the rule the Hopper presets were made with."""

import json
from pathlib import Path

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.calibrate.rates import fitted_rates, read_rates
from stepscope.results.store import RecordStore, make_record
from stepscope.spec.system import load_system

MEASUREMENTS = sorted((Path(__file__).parents[2] / "docs" / "measurements").glob("*-op-rates.json"))


def test_the_hopper_presets_are_the_rule_applied_to_the_shipped_measurements():
    assert len(MEASUREMENTS) == 2
    rows = read_rates(MEASUREMENTS)
    for name in ("H100-SXM", "H200", "H800"):
        preset = load_system(name)
        fitted, _ = fitted_rates(rows, preset)
        # the presets store the fitted values rounded: knots to 3 decimals, the two factors to 2
        for (g, stored), (g2, derived) in zip(preset.accelerator.matrix_efficiency_by_GFLOP,
                                              fitted.accelerator.matrix_efficiency_by_GFLOP, strict=True):
            assert g == g2 and derived == pytest.approx(stored, abs=5e-4)
        assert fitted.accelerator.flash_efficiency == pytest.approx(preset.accelerator.flash_efficiency, abs=5e-3)
        assert fitted.accelerator.fp8_efficiency == pytest.approx(preset.accelerator.fp8_efficiency, abs=5e-3)
        # the K0s, rounded to whole elements; the H100/H800 ones moved from the H200 by memory bandwidth
        for precision, k0 in preset.accelerator.gemm_k0.items():
            assert fitted.accelerator.gemm_k0[precision] == pytest.approx(k0, abs=0.5)


H100_PEAKS = {"bf16": 989.0, "fp8": 1979.0, "cudnn": 989.0}


def rows_of(**measured: float) -> list[dict]:
    """One GEMM row per variant at the given fractions of H100's peaks, and cuDNN attention rows if asked (each row
    also states the fraction of the peak the measuring run compared with: 1, to show it is not the one used)."""
    rows = [{"family": "dense", "variant": v, "measured_TFLOPps": x * H100_PEAKS[v], "measured_of_peak": 1.0,
             "flops": 1e12} for v, x in measured.items() if v in ("bf16", "fp8")]
    if "cudnn" in measured:
        rows += [{"family": "attention", "variant": "cudnn", "measured_TFLOPps": measured["cudnn"] * 989.0,
                  "measured_of_peak": 1.0, "flops": f} for f in (1e11, 2.5e11)]
    return rows


def test_the_rule_by_hand_and_what_it_keeps():
    base = load_system("H100-SXM")
    top = base.accelerator.matrix_efficiency_by_GFLOP[-1][1]
    system, rows = fitted_rates(rows_of(bf16=0.6, fp8=0.45, cudnn=0.3), base)
    acc = system.accelerator
    assert [eta for _, eta in acc.matrix_efficiency_by_GFLOP] == pytest.approx(
        [eta * 0.6 / top for _, eta in base.accelerator.matrix_efficiency_by_GFLOP])
    assert acc.flash_efficiency == pytest.approx(0.3 / 0.6) and acc.fp8_efficiency == pytest.approx(0.75)
    assert acc.matrix_TFLOPps == base.accelerator.matrix_TFLOPps and system.network == base.network
    kept, rows = fitted_rates(rows_of(bf16=0.6), base)
    assert kept.accelerator.flash_efficiency == base.accelerator.flash_efficiency
    assert kept.accelerator.fp8_efficiency == base.accelerator.fp8_efficiency
    # rows without shapes give no K law: the median, and the base's K0 kept
    assert [row["source"].startswith("kept") for row in rows] == [False, True, True, True]
    with pytest.raises(UsageError, match="no dense bf16 GEMM rows"):
        fitted_rates(rows_of(fp8=0.5), base)
    # fractions are of the base's peaks: the same rates on a GPU with twice the peak are half as efficient
    b200 = load_system("B200")
    doubled, _ = fitted_rates(rows_of(bf16=0.6 * b200.accelerator.matrix_peak("bf16") / 989e12), b200)
    assert doubled.accelerator.matrix_efficiency_by_GFLOP[-1][1] == pytest.approx(0.6)
    with pytest.raises(UsageError, match="no fp8 peak"):
        fitted_rates(rows_of(bf16=0.6, fp8=0.5), load_system("A100-80GB"))


def test_cli_writes_a_system_that_predict_accepts_and_bad_files_are_one_line(cli, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"rows": rows_of(bf16=0.6, fp8=0.5, cudnn=0.35)}))
    system = tmp_path / "fitted.toml"
    code, out, err = cli("calibrate", "--rates", rates, "--base", "H100-SXM", "--system-out", system,
                         "--out", tmp_path)
    assert code == 0, err
    assert load_system(system).accelerator.fp8_efficiency == pytest.approx(0.5 / 0.6)
    assert (tmp_path / "calibrate-rates.jsonl").exists()
    code, out, err = cli("predict", "--model", "llama3-8b", "--system", system, "--gpus", "8", "--out", tmp_path)
    assert code == 0, err
    bad, old_schema = tmp_path / "bad.json", tmp_path / "old.json"
    bad.write_text("[1, 2]")
    old_schema.write_text(json.dumps({"rows": [{"model": "llama3-8b", "precision": "bf16", "GFLOP": 412.3}]}))
    for path in (bad, old_schema, tmp_path / "missing.json"):
        code, out, err = cli("calibrate", "--rates", path, "--base", "H100-SXM", "--out", tmp_path / "no")
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "no").exists()


def test_op_rates_records_fit_as_the_json_files_of_the_first_version(tmp_path):
    """`stepscope op-rates` writes records; the same rows as records or as the first version's JSON: one fit."""
    data = json.loads(MEASUREMENTS[0].read_text())
    store = RecordStore(tmp_path, "op-rates")
    for row in data["rows"]:
        metrics = {k: row[k] for k in ("flops", "measured_TFLOPps", "measured_of_peak")}
        config = {k: v for k, v in row.items() if k not in metrics}
        store.append(make_record("op-rates", config, metrics, env={"device_name": data["device"]}))
    store.append(make_record("op-rates", {"family": "attention", "variant": "cudnn"}, status="unsupported",
                             note="not on this torch"))  # a row that was not measured is not read
    base = load_system("H100-SXM")
    from_json, _ = fitted_rates(read_rates([MEASUREMENTS[0]]), base)
    for path in (tmp_path, store.path):
        from_records, _ = fitted_rates(read_rates([path]), base)
        assert from_records == from_json
    (tmp_path / "empty.jsonl").touch()
    with pytest.raises(UsageError, match="is not an op-rates file"):  # records of no op rates
        read_rates([tmp_path / "empty.jsonl"])
