"""A traced run's plan: a config dataclass as JSON and back (nested dataclasses, tuples, optionals, as their
annotations say), and the program that runs a named library function on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from stepscope.distributed.collectives.config import CommConfig
from stepscope.distributed.tracing import traced_job
from stepscope.distributed.tracing.plan import plan_from_json, plan_json
from stepscope.innet.runs.bench import BenchConfig
from stepscope.innet.worker.config import JobConfig
from stepscope.innet.worker.faults import FaultConfig, StragglerSpec


def test_nested_configs_come_back_equal_with_their_types():
    straggler = StragglerSpec(ranks=(1, 3), delay_s=0.02, probability=0.5, steps=(2, 5))
    bench = BenchConfig(world=4, sizes_bytes=(4096, 1 << 20), modes=("batch",), k=3, check=True,
                        job=JobConfig(values_per_packet=4096, window=8, rto_ms=None,
                                      faults=FaultConfig(drop_up=0.05, duplicate=0.01, straggler=straggler)))
    back = plan_from_json(BenchConfig, plan_json(bench))
    assert back == bench and hash(back) == hash(bench)  # frozen dataclasses: tuples, not lists, came back
    assert isinstance(back.job.faults.straggler, StragglerSpec) and back.job.faults.straggler.steps == (2, 5)
    assert back.job.rto_ms is None and back.k == 3
    comm = CommConfig(backends=("gloo", "mpi"), worlds=(2, 3), skews=(0.0, 1.5), threads=None)
    assert plan_from_json(CommConfig, plan_json(comm)) == comm


def test_a_plan_is_plain_json_a_reader_can_check():
    fields = json.loads(plan_json(BenchConfig(sizes_bytes=(64,))))
    assert fields["sizes_bytes"] == [64] and fields["job"]["faults"]["straggler"] is None


@dataclass(frozen=True)
class _Demo:
    sizes: tuple[int, ...] = (1,)
    inner: FaultConfig = FaultConfig()


def _write_config(config: _Demo, out: str) -> None:
    """A stand-in for a benchmark's library function: it writes what it was given."""
    Path(out).mkdir(parents=True)
    (Path(out) / "got.txt").write_text(repr(config))


def test_the_traced_program_calls_the_named_function_with_the_rebuilt_config(tmp_path):
    config = _Demo(sizes=(3, 4), inner=FaultConfig(reorder=0.25, seed=9))
    plan = tmp_path / "plan.json"
    plan.write_text(plan_json(config))
    assert traced_job.main([f"{__name__}:_write_config", str(plan), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "got.txt").read_text() == repr(config)
