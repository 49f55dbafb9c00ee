"""Precision experiments, the models list, `python -m stepscope`, torch.compile, warm-up sweeps."""

import subprocess

import pytest

from stepscope.results.store import read_records
from tests.conftest import STEPSCOPE


def test_precision_accumulate_shows_why_accumulators_stay_fp32(cli, tmp_path):
    code, out, err = cli("precision", "accumulate", "--out", tmp_path)
    assert code == 0, err
    values = {r["config"]["case"]: r["metrics"]["value"] for r in read_records(tmp_path)}
    assert abs(values["fp32 += fp32"] - 10) < 1e-3
    assert abs(values["fp16 += fp16"] - 10) > 0.01  # fp16 accumulation drifts
    assert values["bf16 += bf16"] == 4.0  # 4 + 0.01 rounds back to 4 in bf16
    assert abs(values["fp32 += fp16"] - 10) < 0.01


def test_precision_accumulate_rejects_an_empty_sum(cli, tmp_path):
    code, _, err = cli("precision", "accumulate", "--steps", "0", "--out", tmp_path)
    assert code == 2 and "0 < steps <=" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "precision.jsonl").exists()
    code, _, err = cli("precision", "accumulate", "--increment", "1e308", "--steps", "10", "--out", tmp_path)
    assert code == 2 and "overflows" in err and not (tmp_path / "precision.jsonl").exists()


def test_a_negative_increment_has_positive_relative_errors(cli, tmp_path):
    code, _, err = cli("precision", "accumulate", "--increment", "-0.01", "--out", tmp_path)
    assert code == 0, err
    assert all(r["metrics"]["rel_error"] >= 0 for r in read_records(tmp_path))


def test_csv_batches_stay_aligned_under_their_header():
    import io

    from stepscope.cli.output import Printer

    stream = io.StringIO()
    printer = Printer("csv", stream)
    printer.emit([{"seq": 8, "status": "ok", "ms": 1.5, "note": None}])
    printer.emit([{"seq": 16, "status": "oom", "note": "out of memory"}])  # a subset: same header, aligned
    printer.emit([{"part": "weights", "GiB": 2.0}])  # another table: its own header
    assert stream.getvalue().splitlines() == ["seq,status,ms,note", "8,ok,1.5,", "16,oom,,out of memory",
                                              "part,GiB", "weights,2.0"]


def test_precision_dtypes_for_toy_and_a_preset(cli, tmp_path):
    code, out, err = cli("precision", "dtypes", "--precision", "fp16", "--out", tmp_path)
    assert code == 0, err
    record = read_records(tmp_path)[0]
    modules = {row["module"]: row for row in record["metrics"]["modules"]}
    assert modules["fc1"]["output_dtype"] == "float16" and modules["fc1"]["param_dtype"] == "float32"
    assert modules["fc1"]["grad_dtype"] == "float32" and record["metrics"]["loss_dtype"] == "float32"
    code, out, err = cli("precision", "dtypes", "--model", "tiny", "--n-layers", "1", "--out", tmp_path)
    assert code == 0 and "blocks.0.attn.qkv" in out and "loss dtype: float32" in out


def test_models_lists_presets_with_exact_sizes(cli):
    code, out, _ = cli("models", "--format", "csv")
    assert code == 0
    rows = {line.split(",")[0]: line.split(",") for line in out.splitlines()[1:]}
    assert rows["gpt2"][1] == "124439808" and "llama3-405b" in rows


def test_python_dash_m_and_compile_and_warmup_sweep(tmp_path):
    proc = subprocess.run(STEPSCOPE + ["step", "--model", "tiny", "--n-layers", "1", "--batch", "1", "--seq", "16",
                                       "--mode", "fwd", "--compile", "--warmup", "0,1", "--iters", "2",
                                       "--out", str(tmp_path), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = read_records(tmp_path)
    assert [r["config"]["warmup"] for r in records] == [0, 1]
    assert all(r["config"]["compile"] and r["metrics"]["compile_s"] > 0 for r in records)


@pytest.mark.parametrize("args, message", [
    (["validate", "--system", "MISSING/system.toml"], "no such system file: MISSING/system.toml"),
    (["validate", "--out", "FILE/sub"], "FILE is a file, not a folder"),
    (["models", "MISSING/models.toml"], "unrecognized arguments: MISSING/models.toml"),
    (["show", "MISSING/step.jsonl"], "no such results file or folder: MISSING/step.jsonl"),
    (["show", "FILE"], "no records in FILE"),
])
def test_a_missing_path_is_one_line_and_exit_2(cli, tmp_path, args, message):
    (tmp_path / "file").write_text("not records\n")
    paths = {"MISSING": str(tmp_path / "missing"), "FILE": str(tmp_path / "file")}

    def real(text):
        for placeholder, path in paths.items():
            text = text.replace(placeholder, path)
        return text

    code, out, err = cli(*map(real, args))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and real(message) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing was written


def test_a_ctrl_c_wrapped_by_an_import_is_still_an_interruption(monkeypatch, capsys):
    """Ctrl-C while a lazily imported module defines a class (rich.console did) reaches the command as
    `RuntimeError: Error calling __set_name__` caused by the KeyboardInterrupt: exit 130, no traceback."""
    import stepscope.cli.models as models
    from stepscope.cli.main import main

    def interrupted_import(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ctrl_c:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from ctrl_c

    monkeypatch.setattr(models, "run", interrupted_import)
    assert main(["models"]) == 130
    assert "interrupted" in capsys.readouterr().err

    def crash(args):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(models, "run", crash)
    with pytest.raises(RuntimeError, match="a real bug"):
        main(["models"])


def test_a_value_given_twice_in_a_sweep_is_one_point_but_an_a_a_run_keeps_both(cli, tmp_path):
    from stepscope.cli.options import parse_list, positive_int, unique

    assert unique(parse_list("2,4,2", positive_int, "--batch")) == [2, 4]
    code, out, err = cli("step", "--model", "tiny", "--seq", "16,16", "--warmup", "0", "--iters", "1", "--out",
                         tmp_path)
    assert code == 0 and len(read_records(tmp_path / "step.jsonl")) == 1, err
