"""Analysis of PyTorch profiler (Kineto) traces of real runs, one file per rank: where the GPU time goes per rank and
step, idle / compute / non-compute time (HolisticTraceAnalysis's definitions), communication hidden behind
computation, launch overhead, and the straggler across ranks. Torch-free: JSON in, numpy intervals, records out.

`run_trace(TraceConfig(paths=...), out)` is the library function behind `stepscope trace`.
"""
