"""The Python API: every name `stepscope` exports resolves, `import stepscope` imports no torch, and a library
function called from Python writes the records its command writes."""

import subprocess
import sys

import stepscope
from stepscope.results.store import read_records


def test_every_exported_name_resolves():
    for name in stepscope.__all__:
        assert getattr(stepscope, name) is not None, name


def test_importing_stepscope_imports_no_torch():
    code = "import sys, stepscope; stepscope.get_preset('tiny'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_library_call_writes_the_records_of_the_command(cli, tmp_path):
    spec = stepscope.get_preset("tiny", n_layers=1)
    workload = stepscope.Workload(batch=2, seq=16, mode="fwd")
    config = stepscope.StepConfig(model=spec, workload=workload, device="cpu", warmup=0, iters=1, threads=1)
    stepscope.run_step_sweep([config], tmp_path / "python")
    code, _, err = cli("step", "--model", "tiny", "--n-layers", "1", "--batch", "2", "--seq", "16", "--mode", "fwd",
                       "--device", "cpu", "--warmup", "0", "--iters", "1", "--threads", "1", "--out", tmp_path / "cli")
    assert code == 0, err
    (from_python,), (from_cli,) = read_records(tmp_path / "python"), read_records(tmp_path / "cli")
    assert from_python["kind"] == from_cli["kind"] == "step"
    assert from_python["config"] == from_cli["config"] and from_python["key"] == from_cli["key"]
    assert set(from_python["metrics"]) == set(from_cli["metrics"])
