"""The allocation tracker against tensors of known size, and per-phase memory of the tiny model's step."""

import pytest
import torch

from stepscope.measure.allocations import track_allocations
from stepscope.measure.memory.benchmark import measure_memory
from stepscope.measure.memory.config import MemoryConfig
from stepscope.measure.step.config import StepConfig
from stepscope.spec import Workload, get_preset

MB4 = 1000 * 1000 * 4  # bytes of a 1000 x 1000 fp32 tensor


def test_tracker_sees_exact_sizes_ops_and_frees():
    with track_allocations("cpu") as trace:
        with torch.profiler.record_function("stepscope.a"):
            a = torch.ones(1000, 1000)
            b = a * 2
            del a
        c = torch.zeros(500, 1000)
    big = [x for x in trace.allocations if x.nbytes >= MB4 // 2]
    assert [x.nbytes for x in big] == [MB4, MB4, MB4 // 2]
    assert [x.op for x in big] == ["aten::ones", "aten::mul", "aten::zeros"]
    assert big[0].end_s is not None and big[1].end_s is None and big[2].end_s is None  # only `a` was freed
    assert MB4 * 2 <= trace.peak_bytes < MB4 * 2 + 4096  # a and b were live together, then a went
    assert MB4 * 3 // 2 <= trace.final_bytes < MB4 * 3 // 2 + 4096
    (name, start, end), = [r for r in trace.ranges if r[0] == "stepscope.a"]
    assert trace.peak_between(start, end) == trace.peak_bytes
    assert trace.live_at(end) < MB4 + 4096 and trace.live_at(0.0) < 4096
    del b, c


def test_blocks_allocated_before_tracking_are_not_counted_when_freed():
    before = torch.ones(1000, 1000)
    with track_allocations("cpu") as trace:
        after = torch.ones(250, 1000)
        del before
    assert min(trace.timeline()[1]) >= 0
    assert MB4 // 4 <= trace.final_bytes < MB4 // 4 + 4096
    del after


def measure(seq, mode="train", plot=None):
    config = MemoryConfig(step=StepConfig(model=get_preset("tiny"), workload=Workload(batch=2, seq=seq, mode=mode),
                                          device="cpu", warmup=1, iters=1), top=5)
    return measure_memory(config, plot_path=plot)


def test_peaks_grow_with_sequence_length_and_phases_rise_and_fall(tmp_path):
    short, long = measure(16), measure(128, plot=tmp_path / "timeline.png")
    for result in (short, long):
        phases = {p.phase: p for p in result.phases}
        assert list(phases) == ["init", "warm-up", "forward", "backward", "optimizer"]
        params = result.config.step.model.param_count() * 4
        assert params <= phases["init"].current_bytes < params * 1.2
        # forward keeps activations (AdamW's two states exist since the warm-up step); backward swaps the
        # activations for one gradient per parameter; the optimizer drops the gradients (set_to_none)
        init = phases["init"].current_bytes
        assert phases["warm-up"].current_bytes == phases["optimizer"].current_bytes  # steady state
        assert phases["forward"].current_bytes > init + 2 * params
        assert phases["backward"].current_bytes >= init + 3 * params
        assert init + 2 * params <= phases["optimizer"].current_bytes < init + 3 * params
        for p in result.phases:
            assert p.peak_bytes >= p.current_bytes
    long_phases = {p.phase: p for p in long.phases}
    assert long_phases["forward"].current_bytes > long_phases["backward"].current_bytes  # activations > grads
    for phase in ("forward", "backward"):
        long_peak, short_peak = ({p.phase: p.peak_bytes for p in run.phases}[phase] for run in (long, short))
        assert long_peak > short_peak
    png = long.plot_path.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert long.residual_bytes == 2 * 128 * 64 * 4


def test_tables_and_metrics_of_a_forward_only_point():
    result = measure(32, mode="fwd")
    phase_table, alloc_table = result.tables()
    assert [row["phase"] for row in phase_table.rows] == ["init", "warm-up", "forward"]
    sizes = [row["size_MiB"] for row in alloc_table.rows]
    assert len(sizes) == 5 and sizes == sorted(sizes, reverse=True)
    assert all(row["op"] for row in alloc_table.rows)
    metrics = result.metrics()
    assert metrics["peak_MiB"] == pytest.approx(max(metrics[f"{p}_peak_MiB"] for p in ("init", "warm-up", "forward")))
    assert metrics["residual_MiB"] == pytest.approx(2 * 32 * 64 * 4 / 2**20)
