"""The rates of a model's own matrix ops on this GPU, next to what the performance model assumes for them.

The performance model times a matrix op at η(FLOPs) of the matrix peak (the system's efficiency curve) and
fused attention at `flash_efficiency` x η. A curve's top can be checked against a best-shape benchmark
(mamf-finder), but a training step runs the shapes of its model and plan: this measures exactly those.
- `dense` layouts (model:tp:tokens): the GEMMs of one transformer layer and of the output layer, each in its
  three passes as `torch.nn.Linear` runs them (forward x·Wᵀ, input gradient dY·W, weight gradient dYᵀ·x), in
  bf16 and in fp8 (`torch._scaled_mm`, per-tensor scales, on GPUs that have fp8 tensor cores);
- `cube` sizes: n x n x n products, the curve below the model shapes (calls are launched back to back from
  Python: products under ~20 µs, e.g. 1024³, time the launch rather than the GPU);
- `moe` layouts (model:ep:tokens): the expert GEMMs of one GPU, balanced, as a padded batched matmul (what
  stepscope's grouped MoE path runs) and as `torch._grouped_mm` where torch has it, forward, bf16;
- `attention` layouts (model:tp:seq): causal attention of one layer's local heads, per scaled-dot-product
  backend (flash, cuDNN), forward and backward, against the model's fused-attention rate.
Each row prints the measured rate beside the model's; per dense model the FLOP-weighted ratio is how much
longer the GEMMs really take than a step prediction assumes.

Sustained, not burst, rates: a few seconds of large products first bring the GPU to its power-limited clock
(mamf-finder's MSMF), then every op runs in rounds (all ops of a round back to back, the median over rounds).

    python -m stepscope.measure.op_rates --system H100-SXM --out op_rates.json
    stepscope calibrate --rates op_rates.json --base H100-SXM --system-out mine.toml   (perfmodel/calibrate/rates.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from stepscope.errors import UsageError
from stepscope.spec import get_preset
from stepscope.spec.system import load_system

DENSE = ("llama3-8b:1:8192", "llama3-70b:4:4096", "llama3-405b:8:8192")
"""model:tp:tokens per GPU of validated runs: Llama 3 8B at 8K tokens without TP or CP (torchtitan's, Megatron-
Bridge's), 70B as dgxc-benchmarking runs it (TP 4, CP 2: 4,096), 405B as Meta trained it (TP 8, CP 1, sequence
parallel: the GEMMs see the whole gathered sequence)."""
CUBES = (1024, 1448, 2048, 2896, 4096, 5792, 8192)
MOE = ("qwen3-30b-a3b:16:4096", "deepseek-v3-gqa:64:4096", "mixtral-8x7b:8:4096")
ATTENTION = ("llama3-8b:1:8192", "llama3-70b:4:8192", "llama3-405b:8:8192")


@dataclass(frozen=True)
class MatrixOp:
    """One product of M x K by K x N (`groups` of them for grouped GEMMs, M rows each)."""

    family: str  # dense | cube | moe | attention
    model: str
    op: str
    direction: str  # forward | input-grad | weight-grad | backward
    m: int
    k: int
    n: int
    groups: int = 1
    flops: float = 0.0

    def __post_init__(self) -> None:
        if not self.flops:
            object.__setattr__(self, "flops", 2.0 * self.groups * self.m * self.k * self.n)


def dense_ops(model: str, tp: int, tokens: int) -> list[MatrixOp]:
    """The linear layers of one transformer layer and the output layer on one GPU of a TP group, 3 passes."""
    spec = get_preset(model)
    h, q, kv, f = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff
    up = (2 if spec.mlp == "swiglu" else 1) * f
    linears = {"qkv": (h, (q + 2 * kv) // tp), "attn_out": (q // tp, h), "mlp_up": (h, up // tp),
               "mlp_down": (f // tp, h), "logits": (h, spec.vocab_size // tp)}
    out = []
    for op, (k, n) in linears.items():
        out += [MatrixOp("dense", model, op, "forward", tokens, k, n),
                MatrixOp("dense", model, op, "input-grad", tokens, n, k),
                MatrixOp("dense", model, op, "weight-grad", n, tokens, k)]
    return out


def moe_ops(model: str, ep: int, tokens: int) -> list[MatrixOp]:
    """A GPU's expert GEMMs, forward, with its tokens' top-k copies spread evenly over its n_experts/ep experts."""
    spec = get_preset(model)
    local = spec.n_experts // ep
    rows = tokens * spec.experts_per_token // local
    up = (2 if spec.mlp == "swiglu" else 1) * spec.expert_d_ff
    return [MatrixOp("moe", model, "expert_up", "forward", rows, spec.d_model, up, local),
            MatrixOp("moe", model, "expert_down", "forward", rows, spec.expert_d_ff, spec.d_model, local)]


def attention_ops(model: str, tp: int, seq: int) -> list[MatrixOp]:
    """Causal attention of the layer's local heads for one sequence: model FLOPs as the performance model counts
    them (2·s²·d per head forward, half the square; backward 2.5x), m = s, k = head dim, n = heads."""
    spec = get_preset(model)
    heads, d = spec.n_heads // tp, spec.q_dim // spec.n_heads
    forward = 2.0 * seq * seq * d * heads
    return [MatrixOp("attention", model, "flash_attention", "forward", seq, d, heads, flops=forward),
            MatrixOp("attention", model, "flash_attention", "backward", seq, d, heads, flops=2.5 * forward)]


def _dense_thunk(op: MatrixOp, precision: str, device: torch.device) -> Callable[[], object]:
    """The product in the layout torch.nn.Linear's pass uses (fp8: row-major by column-major, as required)."""
    a = torch.randn(op.m, op.k, device=device, dtype=torch.bfloat16)
    if precision == "fp8":
        scale = torch.ones((), device=device)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = torch.randn(op.n, op.k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
        return lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    if op.direction == "forward":  # x·Wᵀ with W stored (N, K)
        w = torch.randn(op.n, op.k, device=device, dtype=torch.bfloat16)
        return lambda: torch.nn.functional.linear(a, w)
    b = torch.randn(op.k, op.n, device=device, dtype=torch.bfloat16)
    if op.direction == "input-grad":  # dY·W, both row-major
        return lambda: a @ b
    at = torch.randn(op.k, op.m, device=device, dtype=torch.bfloat16).t()  # dYᵀ·x, dY stored (tokens, out)
    return lambda: at @ b


def _grouped_thunk(op: MatrixOp, impl: str, device: torch.device) -> Callable[[], object] | None:
    """`bmm`: (groups, M, K) x (groups, K, N); `grouped_mm`: torch._grouped_mm over the rows sorted by group."""
    b = torch.randn(op.groups, op.k, op.n, device=device, dtype=torch.bfloat16)
    if impl == "bmm":
        a = torch.randn(op.groups, op.m, op.k, device=device, dtype=torch.bfloat16)
        return lambda: torch.bmm(a, b)
    if not hasattr(torch, "_grouped_mm"):
        return None
    a = torch.randn(op.groups * op.m, op.k, device=device, dtype=torch.bfloat16)
    offsets = torch.arange(1, op.groups + 1, device=device, dtype=torch.int32) * op.m
    bt = b.transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major weights, as the kernel wants them
    return lambda: torch._grouped_mm(a, bt, offs=offsets, out_dtype=torch.bfloat16)


def _attention_thunk(op: MatrixOp, backend: str, device: torch.device) -> Callable[[], object] | None:
    """Causal scaled-dot-product attention on one backend; None where torch lacks it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}[backend]
    if chosen is None:
        return None
    q, k, v = (torch.randn(1, op.n, op.m, op.k, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if op.direction == "forward":  # with autograd on: a training forward also writes the logsumexp
        def run():
            with sdpa_kernel(chosen):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return run
    with sdpa_kernel(chosen):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def _seconds_per_call(thunk: Callable[[], object], device: torch.device, min_s: float) -> float:
    """Mean time of back-to-back calls over at least `min_s` (CUDA events; wall clock on CPU). Not
    `timer.time_callable`, which synchronizes around every call to charge host overhead to a step: a kernel's
    rate needs the launches queued behind each other."""
    thunk()
    reps = 1
    while True:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                thunk()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                thunk()
            elapsed = time.perf_counter() - t0
        if elapsed >= min_s or reps >= 1 << 14:
            return elapsed / reps
        reps = max(reps * 2, int(reps * min_s / max(elapsed, 1e-9)) + 1)


def preheat(device: torch.device, seconds: float) -> float:
    """Large bf16 products for `seconds` (clocks down to the power limit); the last second's TFLOP/s."""
    n = 8192 if device.type == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    end, rate = time.perf_counter() + seconds, 0.0
    while time.perf_counter() < end:
        rate = 2.0 * n**3 / _seconds_per_call(lambda: a @ a, device, min(1.0, seconds)) / 1e12
    return rate


def _variants(op: MatrixOp, fp8: bool) -> list[str]:
    """How each op is run: precisions of a GEMM, implementations of a grouped GEMM, backends of attention."""
    if op.family == "moe":
        return ["bmm", "grouped_mm"]
    if op.family == "attention":
        return ["flash", "cudnn"]
    return ["bf16", "fp8"] if fp8 else ["bf16"]


def _thunk(op: MatrixOp, variant: str, device: torch.device) -> Callable[[], object] | None:
    if op.family == "moe":
        return _grouped_thunk(op, variant, device)
    if op.family == "attention":
        return _attention_thunk(op, variant, device)
    return _dense_thunk(op, variant, device)


def measure(ops: list[MatrixOp], system_name: str, rounds: int, min_s: float, preheat_s: float,
            device: torch.device) -> dict:
    """Measured and modelled rate of every op and variant; per dense model the FLOP-weighted time ratio."""
    acc = load_system(system_name).accelerator
    fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)  # Ada/Hopper and later
    hot = preheat(device, preheat_s)
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for i, op in enumerate(ops):
            for variant in _variants(op, fp8):
                try:
                    thunk = _thunk(op, variant, device)
                    if thunk is not None:
                        seconds = _seconds_per_call(thunk, device, min_s)
                        times.setdefault((i, variant), []).append(seconds)
                except (RuntimeError, NotImplementedError) as error:  # a backend refusing a shape, or missing
                    print(f"{op.model} {op.op} {variant}: {str(error).splitlines()[0][:120]}", file=sys.stderr)
                thunk = None
    rows = []
    for (i, variant), seconds in times.items():
        op = ops[i]
        precision = "fp8" if variant == "fp8" else "bf16"
        peak = acc.matrix_peak(precision)
        efficiency = (acc.efficiency(op.flops) * (acc.flash_efficiency if op.family == "attention" else 1.0)
                      * (acc.fp8_efficiency if precision == "fp8" else 1.0))
        measured = op.flops / statistics.median(seconds)
        rows.append({**asdict(op), "variant": variant, "GFLOP": op.flops / 1e9, "measured_TFLOPps": measured / 1e12,
                     "measured_of_peak": measured / peak, "model_TFLOPps": efficiency * peak / 1e12,
                     "model_of_peak": efficiency})
    summary = []
    for model in dict.fromkeys(op.model for op in ops if op.family == "dense"):
        for variant in ("bf16", "fp8"):
            mine = [r for r in rows if r["family"] == "dense" and r["model"] == model and r["variant"] == variant]
            if mine:
                flops = sum(r["flops"] for r in mine)
                real_s = sum(r["flops"] / r["measured_TFLOPps"] for r in mine) / 1e12
                model_s = sum(r["flops"] / r["model_TFLOPps"] for r in mine) / 1e12
                summary.append({"model": model, "precision": variant, "measured_TFLOPps": flops / real_s / 1e12,
                                "model_TFLOPps": flops / model_s / 1e12, "measured_time_over_model": real_s / model_s})
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "system": system_name, "preheat_TFLOPps": hot, "rows": rows,
            "summary": summary}


def _split(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense", default=",".join(DENSE), help="model:tp:tokens comma list ('' for none)")
    parser.add_argument("--cubes", default=",".join(map(str, CUBES)), help="n of n x n x n products")
    parser.add_argument("--moe", default=",".join(MOE), help="model:ep:tokens comma list")
    parser.add_argument("--attention", default=",".join(ATTENTION), help="model:tp:seq comma list")
    parser.add_argument("--system", default="H100-SXM", help="system preset whose rates are compared")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.05, help="per timed batch of calls")
    parser.add_argument("--preheat", type=float, default=5.0, help="seconds of large products first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="JSON file for every row")
    args = parser.parse_args(argv)

    def layouts(text: str, build) -> list[MatrixOp]:
        return [op for item in _split(text) for op in build(item.split(":")[0], *map(int, item.split(":")[1:]))]

    try:
        ops = (layouts(args.dense, dense_ops)
               + [MatrixOp("cube", "-", "matmul", "forward", int(n), int(n), int(n)) for n in _split(args.cubes)]
               + layouts(args.moe, moe_ops) + layouts(args.attention, attention_ops))
        load_system(args.system)
    except (UsageError, ValueError, TypeError) as error:  # a bad layout or system: one line, exit 2
        print(f"op_rates: error: {str(error).splitlines()[0] if str(error) else 'bad layout'}", file=sys.stderr)
        return 2
    result = measure(ops, args.system, args.rounds, args.min_seconds, args.preheat, torch.device(args.device))
    print(f"{result['device']} (torch {result['torch']}), preheat {result['preheat_TFLOPps']:.0f} TFLOP/s; "
          f"model: {result['system']}")
    print(f"{'family':9} {'model':15} {'op':15} {'pass':11} {'M':>6} {'K':>6} {'N':>6} {'G':>3} {'variant':10} "
          f"{'GFLOP':>8} {'meas':>6} {'model':>6} {'of_peak':>7} {'model_of_peak':>13}")
    for r in result["rows"]:
        print(f"{r['family']:9} {r['model']:15} {r['op']:15} {r['direction']:11} {r['m']:6} {r['k']:6} {r['n']:6} "
              f"{r['groups']:3} {r['variant']:10} {r['GFLOP']:8.1f} {r['measured_TFLOPps']:6.0f} "
              f"{r['model_TFLOPps']:6.0f} {r['measured_of_peak']:7.3f} {r['model_of_peak']:13.3f}")
    for s in result["summary"]:
        print(f"{s['model']} {s['precision']}: GEMMs at {s['measured_TFLOPps']:.0f} TFLOP/s measured vs "
              f"{s['model_TFLOPps']:.0f} modelled: they take {s['measured_time_over_model']:.3f}x the model's time")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
