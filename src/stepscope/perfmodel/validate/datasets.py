"""Published measured training runs, as (model, workload, plan, system, measured step time) to predict.

Three datasets ship in `stepscope/data/validation/` (docs/validation-data.md lists every source, what each row
assumes and which published runs are left out and why):
- `narayanan2021_table1`: Megatron-LM GPT 1.7B-1T on up to 3,072 A100s (Narayanan et al. 2021, Table 1), with
  the assumptions `validate.py` states (the 2021 software: fp16, no flash attention, full recomputation, ...);
- `modern_runs`: dense runs of 2021-25 (A100/H100/H200/B200, bf16 and fp8, from 8 to 16,384 GPUs: Megatron-LM,
  Megatron-Core/NeMo, Megatron-DeepSpeed, PyTorch FSDP, Meta's Llama 3), one row per run with its source and the
  exact configuration the source gives; what a source does not give is stated in the row's notes as an
  assumption, never fitted;
- `moe_runs`: Mixture-of-Experts runs (Mixtral, Qwen3-MoE, DeepSeek-V3, MegaScale-MoE's 352B on H100/H800/B200;
  Megatron-Core, Megatron-Bridge, NeMo AutoModel, DeepSeek's report), the same columns plus `ep` and `etp`
  (expert tensor parallelism: a row with etp 1 and tp > 1 is predicted with whole experts,
  `ParallelPlan.expert_tp` 1). DeepSeek-V3 rows use the `deepseek-v3-gqa` preset (GQA with MLA's weights, no
  multi-token prediction module).
Every `modern_runs`/`moe_runs` row names its publication (`source_key`) and its training software (`stack`, one of
the `spec.stack` presets); Table 1's rows are all `narayanan2021` / `megatron-lm-2022`.
Optional columns name the software of a run where it differs from today's defaults: `flash` (no: the s x s
scores are materialised, as in Megatron-LM before 2023), `dropout` (yes: masks kept), `fp32_grads` (yes:
Megatron's fp32 main_grad), `dispatcher` and `ep_overlap` (MoE token exchange, `ParallelPlan`),
`expert_groups` and `groups_per_token` (a benchmark's routing where it overrides the model's, as a fake balanced
gate does), `pipeline_rounds` (gradient accumulation outside the pipeline schedule, as NeMo AutoModel runs it).

A source publishes a step time, tokens/s per GPU, TFLOP/s per GPU or MFU; each becomes a measured step
time: as published, B·s / (tokens/s/GPU · GPUs), or the run's FLOPs / (rate · GPUs) with the FLOPs counted as
the source counts them (`flops_convention`: `6N+attention` is stepscope's `ModelSpec.flops_per_token` with
causal attention counted half, `6N+attention-full` with the full s x s square, as Megatron's and Meta's MFU do;
`6N` without attention; for MoE models N counts the activated weights; `megatron-recompute` the hardware FLOPs
with full recomputation that Narayanan et al. 2021 and Megatron-DeepSpeed print), and MFU against the bf16 dense
peak of the row's system.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources

from stepscope.errors import UsageError
from stepscope.spec import ModelSpec, Workload, get_preset
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.stack import list_stacks
from stepscope.spec.system import load_system

DATASETS = ("narayanan2021_table1", "modern_runs", "moe_runs")


@dataclass(frozen=True)
class PublishedRun:
    """One measured run from a paper or a framework's performance page."""

    source: str
    model: ModelSpec
    workload: Workload
    plan: ParallelPlan
    measured_step_s: float
    measured_tflops_per_gpu: float
    """TFLOP/s per GPU as the source counts them (derived from its metric when it gave another)."""
    label: str
    system: str = "A100-80GB"
    """The system preset the run is predicted on."""
    citation: str = ""
    flops_convention: str = "megatron-recompute"
    source_key: str = ""
    """Short id of the publication the run comes from (docs/validation-data.md lists them)."""
    stack: str = ""
    """The training software that ran it (a `spec.stack` preset; also the plan's `stack`)."""

    @property
    def published_flops(self) -> float:
        """FLOPs per iteration as the source counts them."""
        return run_flops(self.model, self.workload, self.flops_convention)


FLOPS_CONVENTIONS = ("6N+attention", "6N+attention-full", "6N", "megatron-recompute")



def run_flops(spec: ModelSpec, workload: Workload, convention: str) -> float:
    """FLOPs of one training step of `workload` under a source's counting convention."""
    tokens, s = workload.batch * workload.seq, workload.seq
    if convention == "megatron-recompute":  # Narayanan 2021: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
        h, layers = spec.d_model, spec.n_layers
        return 96.0 * tokens * layers * h * h * (1 + s / (6 * h) + spec.vocab_size / (16 * layers * h))
    if convention == "6N+attention":
        return tokens * spec.flops_per_token(s, causal=True)
    if convention == "6N+attention-full":
        return tokens * spec.flops_per_token(s, causal=False)
    if convention == "6N":
        return tokens * 6.0 * spec.matmul_params()
    raise UsageError(f"unknown FLOP convention {convention!r}; known: {', '.join(FLOPS_CONVENTIONS)}")


def load_dataset(name: str = DATASETS[0]) -> list[PublishedRun]:
    """The runs of one shipped dataset."""
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    text = (resources.files("stepscope") / "data" / "validation" / f"{name}.csv").read_text(encoding="utf-8")
    return read_runs(text, name)


def read_runs(text: str, name: str) -> list[PublishedRun]:
    """The runs of a CSV text in the schema of dataset `name` (Table 1's, or the `modern_runs` one for any other
    name); `#` lines are comments."""
    rows = csv.DictReader(io.StringIO("\n".join(line for line in text.splitlines() if not line.startswith("#"))))
    return [_narayanan(row, name) if name == "narayanan2021_table1" else _modern(row, name) for row in rows]


def _narayanan(row: dict[str, str], name: str) -> PublishedRun:
    """A Table 1 row with the 2021 software's assumptions (see `validate.py`)."""
    hidden, layers, heads = int(row["hidden"]), int(row["layers"]), int(row["heads"])
    model = get_preset("megatron-1.7b", d_model=hidden, n_layers=layers, n_heads=heads, d_ff=4 * hidden)
    model = model.replace(name=f"gpt-{row['params_billion']}b")
    workload = Workload(batch=int(row["global_batch"]), seq=2048, precision="fp16", mode="train")
    plan = ParallelPlan(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), micro_batch=1,
                        recompute="full", flash_attention=False, dropout=True, fp32_grads=True,
                        tp_overlap=False, placement=("tp", "dp", "cp", "pp"), stack="megatron-lm-2022")
    return PublishedRun(source=name, model=model, workload=workload, plan=plan,
                        measured_step_s=float(row["iteration_s"]),
                        measured_tflops_per_gpu=float(row["tflops_per_gpu"]), label=f"{row['params_billion']}B",
                        citation="Narayanan et al. 2021, Table 1", source_key="narayanan2021",
                        stack="megatron-lm-2022")


def _modern(row: dict[str, str], name: str) -> PublishedRun:
    """A `modern_runs` row: the plan as published, the measured metric turned into a step time."""
    if not (row.get("source_key") or "").strip():
        raise UsageError(f"{name}: run {row['id']} has no source_key")
    if row.get("stack") not in list_stacks():
        raise UsageError(f"{name}: unknown stack {row.get('stack')!r} in run {row['id']}; "
                         f"known: {', '.join(list_stacks())}")
    model = get_preset(row["model"])
    if row.get("expert_groups"):  # a benchmark's own routing (e.g. a fake balanced gate), not the model's
        model = model.replace(expert_groups=int(row["expert_groups"]), groups_per_token=int(row["groups_per_token"]))
    if int(row["seq"]) > model.context_length:  # a long-context stage of the same model (rotary: no new weights)
        model = model.replace(context_length=int(row["seq"]))
    workload = Workload(batch=int(row["global_batch"]), seq=int(row["seq"]), precision=row["precision"],
                        mode="train")
    plan = ParallelPlan(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]),
                        interleave=int(row["interleave"]), micro_batch=int(row["micro_batch"]),
                        zero=int(row["zero"]), shard_group=int(row["shard_group"]), recompute=row["recompute"],
                        sequence_parallel=row["sequence_parallel"] == "yes",
                        first_stage_layers=int(row["first_stage_layers"]),
                        last_stage_layers=int(row["last_stage_layers"]), fp8_recipe=row["fp8_recipe"] or "delayed",
                        tp_overlap=row["tp_overlap"] == "yes", ep=int(row.get("ep") or 1),
                        ep_overlap=row.get("ep_overlap") == "yes", dispatcher=row.get("dispatcher") or "alltoall",
                        flash_attention=row.get("flash") != "no", dropout=row.get("dropout") == "yes",
                        fp32_grads=row.get("fp32_grads") == "yes",
                        expert_tp=1 if row.get("etp") == "1" and int(row["tp"]) > 1 else 0,
                        pipeline_rounds=int(row.get("pipeline_rounds") or 1), stack=row["stack"])
    gpus, metric, value = int(row["gpus"]), row["metric"], float(row["value"])
    convention = row["flops_convention"]
    flops = run_flops(model, workload, convention)
    if metric == "step_time_s":
        step_s = value
    elif metric == "tokens_per_s_per_gpu":
        step_s = workload.batch * workload.seq / (value * gpus)
    elif metric == "tflops_per_gpu":
        step_s = flops / (value * 1e12 * gpus)
    elif metric == "mfu_pct":
        peak = load_system(row["system"]).accelerator.matrix_peak("bf16")
        step_s = flops / (value / 100 * peak * gpus)
    else:
        raise UsageError(f"{name}: unknown metric {metric!r} in run {row['id']}")
    return PublishedRun(source=name, model=model, workload=workload, plan=plan, measured_step_s=step_s,
                        measured_tflops_per_gpu=flops / step_s / gpus / 1e12, label=row["id"], system=row["system"],
                        citation=row["source"], flops_convention=convention, source_key=row["source_key"],
                        stack=row["stack"])
