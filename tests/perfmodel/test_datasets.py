"""The shipped validation data: every row loads with its publication and stack, reproduces the figure its source
prints, and none comes from the sources held back as an independent check (torchtitan's files, MLPerf)."""

import csv
import io
from importlib import resources

import pytest

from stepscope.errors import UsageError
from stepscope.perfmodel.validate.datasets import DATASETS, load_dataset, read_runs
from stepscope.spec.stack import list_stacks

RUNS = {run.label: run for name in DATASETS for run in load_dataset(name)}


def _csv_rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("stepscope") / "data" / "validation" / f"{name}.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


# What each source prints, copied from the source by hand (row id, quantity, printed value, peak TFLOP/s the
# source divides by for an MFU). At least one row per source_key; several where a source prints a figure other
# than the row's own metric (then the check also tests the FLOP convention the row names).
PRINTED = [
    # Narayanan et al. 2021, Table 1 (iteration_s is derived; the TFLOP/s are printed)
    ("1.7B", "TFLOP/s", 137, None), ("145.6B", "TFLOP/s", 148, None), ("1008.0B", "TFLOP/s", 163, None),
    # Korthikanti et al. 2022, Table 5 and §6.3: step times with their MFU
    ("korthikanti22-gpt3-175b-selective", "MFU", 51.4, 312), ("korthikanti22-530b-selective-dp8", "MFU", 54.2, 312),
    ("korthikanti22-1t-selective", "MFU", 56.3, 312),
    # Dubey et al. 2024 (Llama 3), Table 4
    ("llama3-405b-8k-gpus", "TFLOP/s", 430, None), ("llama3-405b-128k-context", "TFLOP/s", 380, None),
    # dgxc-benchmarking v24.11.1: step times with their MFU (fp8 ones 'of 1979 TF')
    ("dgxc-gpt3-175b-bf16-128", "MFU", 49.93, 989), ("dgxc-gpt3-175b-fp8-128", "MFU", 37.56, 1979),
    ("dgxc-llama3-70b-bf16-64", "MFU", 54.10, 989), ("dgxc-llama3-405b-fp8-576", "MFU", 42.71, 1979),
    ("dgxc-gpt3-175b-fp8-2048", "MFU", 35.63, 1979), ("dgxc-gpt3-175b-bf16-512", "MFU", 48.94, 989),
    # Megatron-Bridge performance-summary archive: tokens/s with their model TFLOP/s
    ("mbridge-25.09-llama3-70b-fp8-h100-64", "TFLOP/s", 727, None),
    ("mbridge-25.11-llama31-405b-fp8cs-h100-1024-gbs512", "TFLOP/s", 737, None),
    ("mbridge-25.11-llama3-8b-fp8cs-b200-8", "TFLOP/s", 1576, None),
    ("mbridge-26.04.01-qwen3-235b-a22b-fp8-h100-256-gbs8192", "TFLOP/s", 253, None),
    ("mbridge-25.11-qwen3-235b-a22b-mxfp8-b200-64", "TFLOP/s", 484, None),
    # NeMo AutoModel performance summary: step times with their TFLOP/s
    ("automodel-llama3-70b-bf16-h100-64", "TFLOP/s", 389, None),
    ("automodel-qwen3-30b-a3b-bf16-h100-8", "TFLOP/s", 277, None),
    # Megatron-Core MoE README: 468 TFLOPS
    ("mcore-v0.9-mixtral-8x7b-bf16-h100-64", "TFLOP/s", 468, None),
    # Megatron-LM README @f2e5db402c model table
    ("mcore-r0.8-gpt-1.7b-bf16-h100-48", "TFLOP/s", 408.8, None),
    ("mcore-r0.8-gpt-462b-bf16-h100-6144", "TFLOP/s", 459.9, None),
    # DeepSeek-V3 report: 180K H800 GPU hours per trillion tokens
    ("deepseek-v3-h800-2048-derived", "GPU-hours per 1e12 tokens", 180e3, None),
    # NeMo performance summary pages (24.07, 25.02): tokens/s with their model TFLOP/s
    ("nemo-24.07-llama2-7b-fp8-h100-8", "TFLOP/s", 780, None),
    ("nemo-24.07-llama2-70b-fp8-h100-64", "TFLOP/s", 768, None),
    ("nemo-25.02-mixtral-8x22b-fp8-b200-256", "TFLOP/s", 824, None),
    # NeMo long-sequence page, Llama 2 7B fp8 with CP
    ("nemo-longseq-llama2-7b-fp8-h100-128k", "TFLOP/s", 555, None),
    # MegaScale Table 2 and Figure 9: the Megatron-LM baseline's MFU
    ("megascale24-megatron-175b-a100-256-gbs768", "MFU", 53.0, 312),
    ("megascale24-megatron-175b-a100-12288-gbs6144", "MFU", 41.2, 312),
    ("megascale24-megatron-530b-a100-11200", "MFU", 48.2, 312),
    # MegaScale-MoE Table 3: iteration time with the whole run's tokens/s
    ("megascale-moe-megatron-352b-h800-1440", "tokens/s", 746.6e3, None),
    ("megascale-moe-megatron-352b-h800-720", "tokens/s", 430.5e3, None),
    # MT-NLG §2.4: 60.1/50.2/44.4 s = 126/121/113 TFLOP/s (hardware FLOPs with recomputation)
    ("mtnlg22-530b-a100-2240", "TFLOP/s", 126, None), ("mtnlg22-530b-a100-2800", "TFLOP/s", 121, None),
    ("mtnlg22-530b-a100-3360", "TFLOP/s", 113, None),
    # llm-foundry benchmark table: tokens/s/GPU with MFU and 'Model TFLOP'
    ("mpt-70b-bf16-h100-128-s2048", "MFU", 43.36, 989), ("mpt-70b-bf16-h100-128-s2048", "TFLOP/s", 428, None),
    ("mpt-7b-bf16-h100-512-s2048", "MFU", 42.2, 989), ("mpt-3b-fp8-h100-8-s8192", "TFLOP/s", 460, None),
    ("mpt-30b-bf16-a100-8-s2048", "MFU", 55.3, 312),
]


def _reproduced(label: str, quantity: str, peak_tflops: float | None) -> float:
    """The row's measured step time turned back into the quantity its source prints."""
    run = RUNS[label]
    gpus, tokens = run.plan.gpus, run.workload.batch * run.workload.seq
    tflops = run.published_flops / run.measured_step_s / gpus / 1e12
    if quantity == "TFLOP/s":
        return tflops
    if quantity == "MFU":
        return 100 * tflops / peak_tflops
    if quantity == "tokens/s":
        return tokens / run.measured_step_s
    assert quantity == "GPU-hours per 1e12 tokens"
    return 1e12 / (tokens / run.measured_step_s / gpus) / 3600


@pytest.mark.parametrize("label,quantity,printed,peak_tflops", PRINTED)
def test_each_row_reproduces_the_figure_its_source_prints(label, quantity, printed, peak_tflops):
    assert _reproduced(label, quantity, peak_tflops) == pytest.approx(printed, rel=0.01)


def test_every_source_has_a_printed_figure_checked():
    assert {RUNS[label].source_key for label, *_ in PRINTED} == {run.source_key for run in RUNS.values()}


def test_every_shipped_row_loads_with_its_publication_and_stack():
    counts = {name: len(load_dataset(name)) for name in DATASETS}
    assert sum(counts.values()) == len(RUNS) >= 60  # run ids are unique across the datasets
    assert len({run.source_key for run in RUNS.values()}) >= 6
    assert all(run.source_key and run.stack in list_stacks() and run.plan.stack == run.stack for run in RUNS.values())
    assert {(run.source_key, run.stack) for run in load_dataset("narayanan2021_table1")} == {
        ("narayanan2021", "megatron-lm-2022")}
    # a source's rows share one stack here; MegaScale's Megatron-LM baseline is the 2023 pre-TE code
    assert RUNS["megascale24-megatron-175b-a100-256-gbs768"].stack == "megatron-lm-2022"
    assert RUNS["mtnlg22-530b-a100-2240"].flops_convention == "megatron-recompute"


def test_no_row_comes_from_a_held_back_source():
    rows = [row for name in ("modern_runs", "moe_runs") for row in _csv_rows(name)]
    assert len(rows) == len(RUNS) - len(load_dataset("narayanan2021_table1"))
    for row in rows:
        text = (row["source"] + row["notes"]).lower()
        assert not any(word in text for word in ("torchtitan", "mlperf", "mlcommons")), row["id"]
    assert "torchtitan-llama3-8b-fp8-h200-32" not in RUNS


def _with(name: str, label: str, **changes: str) -> str:
    """The CSV text of dataset `name` with some fields of one row changed."""
    rows = _csv_rows(name)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(dict(row, **changes) if row["id"] == label else row for row in rows)
    return out.getvalue()


def test_an_unknown_stack_or_a_missing_source_key_names_the_row():
    assert len(read_runs(_with("moe_runs", "deepseek-v3-h800-2048-derived"), "moe_runs")) == len(
        load_dataset("moe_runs"))
    with pytest.raises(UsageError, match="unknown stack 'megatron' in run mpt-7b-bf16-h100-128-s2048"):
        read_runs(_with("modern_runs", "mpt-7b-bf16-h100-128-s2048", stack="megatron"), "modern_runs")
    with pytest.raises(UsageError, match="run deepseek-v3-h800-2048-derived has no source_key"):
        read_runs(_with("moe_runs", "deepseek-v3-h800-2048-derived", source_key=" "), "moe_runs")
