"""The GEMM rates of a model's own layers on this GPU, next to what the performance model assumes for them.

The performance model times a matrix op at η(FLOPs) of the matrix peak (the system's efficiency curve). A
curve's top can be checked against a best-shape benchmark (mamf-finder), but a training step runs the shapes
of its model and plan: this sweeps exactly those. For each model (tensor-parallel degree, tokens per GPU)
it times the GEMMs of one transformer layer and of the output layer, each in its three passes as
`torch.nn.Linear` runs them (forward y = x·Wᵀ, input gradient dY·W, weight gradient dYᵀ·x), in bf16
(`torch.matmul`) and fp8 (`torch._scaled_mm`, per-tensor scales, where the GPU has it), and prints each
measured rate beside the model's: the FLOP-weighted ratio per model is how much longer (or shorter) the
model's GEMMs really take than the step prediction assumes.

Sustained, not burst, rates: a few seconds of large products first bring the GPU to its power-limited
clock (mamf-finder's MSMF), then every shape runs in rounds (all shapes of a round back to back, the
median over rounds) so each is measured at the same temperature.

    python -m stepscope.measure.gemm_shapes --system H100-SXM --out gemm_shapes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from stepscope.spec import get_preset
from stepscope.spec.system import load_system

DEFAULT_LAYOUTS = ("llama3-8b:1:8192", "llama3-70b:4:4096", "llama3-405b:8:8192")
"""model:tp:tokens per GPU: dgxc-benchmarking's Llama 3.1 8B (TP1, CP2, seq 8192), 70B (TP4, CP2) and 405B
(TP8, sequence parallel: the GEMMs see the whole gathered sequence) plans."""


@dataclass(frozen=True)
class Gemm:
    """One product of M x K by K x N."""

    model: str
    op: str
    direction: str  # forward | input-grad | weight-grad
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def layer_gemms(model: str, tp: int, tokens: int) -> list[Gemm]:
    """The linear layers of one transformer layer and the output layer on one GPU of a TP group, 3 passes."""
    spec = get_preset(model)
    h, q, kv, f = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff
    up = (2 if spec.mlp == "swiglu" else 1) * f
    linears = {"qkv": (h, (q + 2 * kv) // tp), "attn_out": (q // tp, h), "mlp_up": (h, up // tp),
               "mlp_down": (f // tp, h), "logits": (h, spec.vocab_size // tp)}
    out = []
    for op, (k, n) in linears.items():
        out += [Gemm(model, op, "forward", tokens, k, n), Gemm(model, op, "input-grad", tokens, n, k),
                Gemm(model, op, "weight-grad", n, tokens, k)]
    return out


def _operands(g: Gemm, precision: str, device: torch.device):
    """A thunk running the product in the layout torch.nn.Linear's pass uses."""
    a = torch.randn(g.m, g.k, device=device, dtype=torch.bfloat16)
    if precision == "fp8":
        scale = torch.ones((), device=device)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = torch.randn(g.n, g.k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major
        return lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    if g.direction == "forward":  # x·Wᵀ with W stored (N, K)
        w = torch.randn(g.n, g.k, device=device, dtype=torch.bfloat16)
        return lambda: torch.nn.functional.linear(a, w)
    if g.direction == "input-grad":  # dY·W, both row-major
        b = torch.randn(g.k, g.n, device=device, dtype=torch.bfloat16)
        return lambda: a @ b
    at = torch.randn(g.k, g.m, device=device, dtype=torch.bfloat16).t()  # dYᵀ·x: dY stored (tokens, out)
    b = torch.randn(g.k, g.n, device=device, dtype=torch.bfloat16)
    return lambda: at @ b


def _seconds_per_call(thunk, device: torch.device, min_s: float) -> float:
    """Mean time of back-to-back calls over at least `min_s` (CUDA events; wall clock on CPU)."""
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


def sweep(layouts: list[str], system_name: str, precisions: list[str], rounds: int, min_s: float,
          preheat_s: float, device: torch.device) -> dict:
    """Measured and modelled rates of every GEMM of `layouts`, and the FLOP-weighted time ratio per model."""
    system = load_system(system_name)
    acc = system.accelerator
    gemms = [g for layout in layouts for g in layer_gemms(layout.split(":")[0], *map(int, layout.split(":")[1:]))]
    if "fp8" in precisions and not (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)):
        precisions = [p for p in precisions if p != "fp8"]  # fp8 tensor cores: Ada/Hopper and later
    hot = preheat(device, preheat_s)
    runs = {(p, i): [] for p in precisions for i in range(len(gemms))}
    for _ in range(rounds):
        for p in precisions:
            for i, g in enumerate(gemms):
                thunk = _operands(g, p, device)
                runs[(p, i)].append(_seconds_per_call(thunk, device, min_s))
                del thunk
    rows = []
    for (p, i), times in runs.items():
        g = gemms[i]
        measured = g.flops / statistics.median(times)
        modelled = acc.efficiency(g.flops) * acc.matrix_peak(p)
        rows.append({**asdict(g), "precision": p, "GFLOP": g.flops / 1e9, "measured_TFLOPps": measured / 1e12,
                     "measured_of_peak": measured / acc.matrix_peak(p), "model_TFLOPps": modelled / 1e12,
                     "model_over_measured": modelled / measured})
    summary = []
    for model in dict.fromkeys(g.model for g in gemms):
        for p in precisions:
            mine = [r for r in rows if r["model"] == model and r["precision"] == p]
            flops = sum(r["GFLOP"] for r in mine) * 1e9
            real_s = sum(r["GFLOP"] * 1e9 / (r["measured_TFLOPps"] * 1e12) for r in mine)
            model_s = sum(r["GFLOP"] * 1e9 / (r["model_TFLOPps"] * 1e12) for r in mine)
            summary.append({"model": model, "precision": p, "measured_TFLOPps": flops / real_s / 1e12,
                            "model_TFLOPps": flops / model_s / 1e12, "measured_time_over_model": real_s / model_s})
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "system": system.name, "preheat_TFLOPps": hot, "rows": rows,
            "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS), help="model:tp:tokens comma list")
    parser.add_argument("--system", default="H100-SXM", help="system preset whose curve is compared")
    parser.add_argument("--precisions", default="bf16,fp8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.05, help="per timed batch of calls")
    parser.add_argument("--preheat", type=float, default=5.0, help="seconds of large products first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="JSON file for every row")
    args = parser.parse_args(argv)
    result = sweep(args.layouts.split(","), args.system, args.precisions.split(","), args.rounds,
                   args.min_seconds, args.preheat, torch.device(args.device))
    print(f"{result['device']} (torch {result['torch']}), preheat {result['preheat_TFLOPps']:.0f} TFLOP/s; "
          f"model: {result['system']}'s curve")
    print(f"{'model':12} {'op':9} {'pass':11} {'M':>6} {'K':>6} {'N':>6} {'prec':4} {'GFLOP':>8} "
          f"{'meas':>6} {'model':>6} {'of_peak':>7}")
    for r in result["rows"]:
        print(f"{r['model']:12} {r['op']:9} {r['direction']:11} {r['m']:6} {r['k']:6} {r['n']:6} "
              f"{r['precision']:4} {r['GFLOP']:8.1f} {r['measured_TFLOPps']:6.0f} {r['model_TFLOPps']:6.0f} "
              f"{r['measured_of_peak']:7.3f}")
    for s in result["summary"]:
        print(f"{s['model']} {s['precision']}: GEMMs at {s['measured_TFLOPps']:.0f} TFLOP/s measured vs "
              f"{s['model_TFLOPps']:.0f} modelled: they take {s['measured_time_over_model']:.3f}x the model's time")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
