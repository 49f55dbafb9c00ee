"""The attention benchmark library on tiny sizes: records, correctness gate, OOM rows, memory scaling,
resume, presets and the plot. (Speed claims are benchmark output, never asserted here.)"""

import math

import pytest
import torch

import stepscope.measure.attention.benchmark as bench
from stepscope.errors import UsageError
from stepscope.kernels.flash_torch import DEFAULT_TILES, FlashAttentionTorch, TileSizes
from stepscope.measure.attention.benchmark import attention_impl, run_attention_sweep
from stepscope.measure.attention.config import AttentionBenchConfig
from stepscope.measure.attention.memory import measure_attention_memory
from stepscope.measure.attention.plot import plot_attention
from stepscope.measure.attention.presets import preset_fields
from stepscope.nn.attention_reference import attention_flops
from stepscope.results.store import RecordStore

TINY = dict(impls=("naive", "sdpa", "flash-torch"), batch=(2,), heads=(2,), seq=(48, 80), dim=(16,),
            causal=(True,), warmup=0, iters=2, device="cpu", startup_s=0.1)


def statuses(outcome):
    return [(r["config"]["seq"], r["config"]["impl"], r["status"]) for r in outcome.records]


def test_tiny_sweep_writes_well_formed_records(tmp_path):
    config = AttentionBenchConfig(**TINY, check_rows=32)
    outcome = run_attention_sweep(config, tmp_path)
    assert statuses(outcome) == [(seq, impl, "ok") for seq in (48, 80) for impl in TINY["impls"]]
    assert RecordStore(tmp_path, "attention").records() == outcome.records
    for record in outcome.records:
        metrics, config_ = record["metrics"], record["config"]
        for prefix, pass_ in (("fwd", "fwd"), ("bwd", "bwd"), ("fwd_bwd", "fwd-bwd")):
            assert metrics[f"{prefix}_ms_median"] > 0 and metrics[f"{prefix}_n"] == 2
            flops = attention_flops(4, config_["seq"], config_["seq"], 16, True, pass_)
            assert metrics[f"{prefix}_TFLOPps"] == pytest.approx(flops / (metrics[f"{prefix}_ms_median"] / 1e3) / 1e12)
        assert metrics["fwd_peak_MiB"] > 0 and metrics["bwd_peak_MiB"] > 0 and metrics["saved_MiB"] > 0
        assert all(metrics[f"err_{t}"] < 1e-5 for t in ("out", "dq", "dk", "dv"))
        assert metrics["checked_rows"] == min(config_["seq"], 32)
        assert {"torch", "device", "threads", "cpu_model", "utc_time"} <= set(record["env"])
    by_impl = {r["config"]["impl"]: r["metrics"] for r in outcome.records[3:]}
    assert "fwd_bwd_ratio_vs_sdpa" in by_impl["naive"] and "fwd_bwd_ratio_vs_naive" in by_impl["sdpa"]
    assert {"fwd_bwd_ratio_vs_sdpa", "fwd_bwd_ratio_vs_naive", "bwd_peak_ratio_vs_naive"} <= set(by_impl["flash-torch"])
    # flash keeps O and L beyond its inputs; naive keeps N x N scores and probabilities
    assert by_impl["flash-torch"]["saved_beyond_inputs_MiB"] < by_impl["naive"]["saved_beyond_inputs_MiB"] / 4


def test_a_wrong_implementation_gets_a_mismatch_row_and_no_timing(monkeypatch):
    def broken(name):
        fn = attention_impl(name)
        return (lambda q, k, v, causal: fn(q, k, v, causal) * 1.01) if name == "flash-torch" else fn

    monkeypatch.setattr(bench, "attention_impl", broken)
    outcome = run_attention_sweep(AttentionBenchConfig(**{**TINY, "seq": (48,)}))
    assert statuses(outcome) == [(48, "naive", "ok"), (48, "sdpa", "ok"), (48, "flash-torch", "mismatch")]
    wrong = outcome.records[-1]
    assert wrong["note"].endswith("> tolerance 0.0001 (fp32)")
    assert "fwd_ms_median" not in wrong["metrics"] and wrong["metrics"]["err_out"] > 1e-3


def test_own_kernels_in_low_precision_must_stay_within_twice_pytorchs_error(monkeypatch):
    """An error of 0.3% passes the fixed fp16 sanity gate (1%) but not 2x SDPA's own fp16 error."""
    def slightly_off(name):
        fn = attention_impl(name)
        return (lambda q, k, v, causal: fn(q, k, v, causal) * 1.003) if name == "flash-torch" else fn

    monkeypatch.setattr(bench, "attention_impl", slightly_off)
    outcome = run_attention_sweep(AttentionBenchConfig(**{**TINY, "seq": (48,), "dtype": ("fp16",)}))
    assert statuses(outcome) == [(48, "naive", "ok"), (48, "sdpa", "ok"), (48, "flash-torch", "mismatch")]
    assert "2x PyTorch's own error" in outcome.records[-1]["note"]
    monkeypatch.undo()
    outcome = run_attention_sweep(AttentionBenchConfig(**{**TINY, "seq": (48,), "dtype": ("fp16",)}))
    assert [r["status"] for r in outcome.records] == ["ok", "ok", "ok"]  # the real kernel passes the rule


def test_out_of_memory_and_errors_become_rows_and_the_sweep_goes_on(monkeypatch):
    def failing(name):
        fn = attention_impl(name)

        def run(q, k, v, causal):
            if name == "naive" and q.shape[-2] > 48:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")
            if name == "sdpa" and q.shape[-2] > 48:
                raise ValueError("something else broke")
            return fn(q, k, v, causal)

        return run

    monkeypatch.setattr(bench, "attention_impl", failing)
    outcome = run_attention_sweep(AttentionBenchConfig(**TINY))
    assert statuses(outcome) == [(48, "naive", "ok"), (48, "sdpa", "ok"), (48, "flash-torch", "ok"),
                                 (80, "naive", "oom"), (80, "sdpa", "error"), (80, "flash-torch", "ok")]
    assert "can't allocate memory" in outcome.records[3]["note"]
    assert outcome.records[4]["note"] == "ValueError: something else broke"
    assert "fwd_bwd_ratio_vs_sdpa" not in outcome.records[5]["metrics"]  # no baseline ran at 80


def test_resume_measures_only_missing_points(tmp_path):
    store = RecordStore(tmp_path, "attention")
    run_attention_sweep(AttentionBenchConfig(**{**TINY, "seq": (48,)}), tmp_path)
    outcome = run_attention_sweep(AttentionBenchConfig(**TINY), tmp_path, resume=True)
    assert outcome.skipped == 3 and statuses(outcome) == [(80, impl, "ok") for impl in TINY["impls"]]
    assert len(store.records()) == 6


def test_flash_peak_memory_grows_linearly_and_naive_quadratically():
    """log-log slope of the fwd+bwd peak against N over a tiny sweep: ~1 for flash-torch, ~2 for naive."""
    FlashAttentionTorch.tiles = TileSizes(64, 64, 64, 64)  # tiles smaller than N: only O(N) buffers grow
    try:
        peaks: dict[str, list[float]] = {"naive": [], "flash-torch": []}
        seqs = (256, 512, 1024)
        for seq in seqs:
            q, k, v, grad_out = (torch.randn(2, 1, seq, 16) for _ in range(4))
            for tensor in (q, k, v):
                tensor.requires_grad_(True)
            for name in peaks:
                fn = attention_impl(name)
                memory = measure_attention_memory(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v, True),
                                                  lambda out, grad_out=grad_out: out.backward(grad_out),
                                                  (q, k, v), torch.device("cpu"))
                peaks[name].append(max(memory.fwd_peak_bytes, memory.bwd_peak_bytes))
                q.grad = k.grad = v.grad = None
    finally:
        FlashAttentionTorch.tiles = DEFAULT_TILES
    slope = {name: math.log(values[-1] / values[0]) / math.log(seqs[-1] / seqs[0]) for name, values in peaks.items()}
    assert slope["flash-torch"] < 1.3 and slope["naive"] > 1.8, (slope, peaks)


def test_presets_reproduce_the_published_sizes_and_scale_down_on_cpu():
    naive_gpu, naive_cpu = preset_fields("naive-sweep", "cuda"), preset_fields("naive-sweep", "cpu")
    assert (naive_gpu["batch"], naive_gpu["heads"], naive_gpu["dim"]) == ((8,), (1,), (16, 32, 64, 128))
    assert naive_gpu["seq"] == (256, 1024, 4096, 8192, 16384) and naive_gpu["passes"] == ("fwd", "bwd")
    assert max(naive_cpu["seq"]) < max(naive_gpu["seq"]) and naive_cpu["dim"] == naive_gpu["dim"]
    flash_gpu, flash_cpu = preset_fields("flash-sweep", "cuda"), preset_fields("flash-sweep", "cpu")
    assert flash_gpu["seq"] == tuple(2 ** i for i in range(7, 17)) and flash_gpu["causal"] == (True,)
    assert flash_gpu["dtype"] == ("bf16", "fp32") and flash_gpu["passes"] == ("fwd", "bwd", "fwd-bwd")
    assert "flash-triton" in flash_gpu["impls"] and "flash-torch" in flash_cpu["impls"]
    assert flash_cpu["grid"] == "flash-sweep" and max(flash_cpu["seq"]) < 65536
    for fields in (naive_cpu, flash_cpu):
        AttentionBenchConfig(**fields).validate()
    with pytest.raises(UsageError, match="unknown grid"):
        preset_fields("nope", "cpu")


@pytest.mark.parametrize("fields, message", [
    ({"dtype": ("fp8",)}, "invalid dtype"),
    ({"passes": ("up",)}, "invalid pass"),
    ({"impls": ("magic",)}, "unknown implementation"),
    ({"seq": (0,)}, "seq must be positive"),
    ({"iters": 0}, "iters > 0"),
])
def test_invalid_configs_are_usage_errors(fields, message):
    with pytest.raises(UsageError, match=message):
        AttentionBenchConfig(**{**TINY, **fields}).validate()


def test_plot_writes_a_png(tmp_path):
    outcome = run_attention_sweep(AttentionBenchConfig(**{**TINY, "passes": ("fwd",), "iters": 1}))
    path = plot_attention(outcome.records, tmp_path / "plots" / "attention.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
