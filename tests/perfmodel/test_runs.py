"""What the runs share: the modelled workload derives what was not given; records go nowhere with out=None."""

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.runs import ModelledWorkload, RunRecords, system_of
from stepscope.results.store import read_records
from stepscope.spec import get_preset
from stepscope.spec.system import load_system


def test_modelled_workload_derives_batch_and_seq():
    spec = get_preset("gpt2")
    workload = ModelledWorkload().workload(spec, batch=16)
    assert (workload.batch, workload.seq) == (16, spec.context_length)
    assert (workload.precision, workload.mode) == ("bf16", "train")
    assert ModelledWorkload(global_batch=8, seq=128).workload(spec, batch=16).batch == 8
    with pytest.raises(UsageError, match="exceeds the model's context_length"):
        ModelledWorkload(seq=spec.context_length + 1).workload(spec, batch=1)


def test_run_records_write_one_environment_and_nothing_without_out(tmp_path):
    assert RunRecords(None, "predict").path is None
    RunRecords(None, "predict").append({"a": 1}, {"b": 2})  # no folder, no error
    records = RunRecords(tmp_path / "new", "predict")
    assert records.path == tmp_path / "new" / "predict.jsonl" and records.path.exists()  # proven writable up front
    records.append({"a": 1}, {"b": 2})
    records.append({"a": 2}, {"b": 3})
    first, second = read_records(records.path)
    assert first["kind"] == "predict" and first["config"] == {"a": 1} and first["metrics"] == {"b": 2}
    assert first["env"] == second["env"] and "stepscope_version" in first["env"]


def test_system_of_takes_a_name_or_a_system():
    cpu = load_system("CPU")
    assert system_of(cpu) is cpu and system_of("cpu").name == cpu.name
