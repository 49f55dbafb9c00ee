"""Data-parallel training: four gradient-synchronization variants behind one interface.

    model = DDPBucketed(TransformerLM(spec), bucket_size_mb=25)   # broadcasts rank 0's weights
    loss = lm_loss(model(tokens), targets); loss.backward()
    model.finish_gradient_synchronization()                       # .grad now holds the AVERAGE
    optimizer.step()

| variant | communication | overlaps backward |
|---|---|---|
| `DDPNaive` | one blocking all-reduce per parameter, after backward | no |
| `DDPFlat` | one all-reduce of all gradients flattened (per dtype), after backward | no |
| `DDPIndividualParameters` | one async all-reduce per parameter from its post-accumulate-grad hook | yes |
| `DDPBucketed(bucket_size_mb)` | one async all-reduce per bucket (`stepscope.spec.buckets`) | yes |

Communication hooks (PyTorch DDP's contract, so ONE hook function serves
`torch.nn.parallel.DistributedDataParallel` and these wrappers alike):

    wrapper.register_comm_hook(state, hook)
    hook(state, bucket) -> torch.futures.Future[torch.Tensor]

`bucket` offers `torch.distributed.GradBucket`'s methods: `index()` (launch position in the step),
`buffer()` (flat 1-D local gradients), `is_last()`, `parameters()` and `gradients()` (views of the buffer
shaped like each parameter), plus `set_buffer()`. The hook must return a future whose value is the
REDUCED AND AVERAGED flat gradient with `buffer()`'s element count (the hook does the averaging, as
PyTorch's `allreduce_hook` does); the wrapper writes it back into `.grad`. A "bucket" is one parameter for
the naive and individual variants, everything (per dtype) for flat, one planned bucket for bucketed.
Without a hook, `allreduce_average` (divide by the world size, async all-reduce) is used.

The benchmark of `stepscope ddp` lives here too: `bench_config` (its point, torch-free), `benchmark` (the
parent: launch, combine, `run_ddp_sweep` writes the `ddp` records and the plot), `bench_rank` (one rank),
`bench_result` (the combined figures and their views), `memory`, `plot`.
"""

import importlib
from typing import Any

_WRAPPERS = {"DDPNaive": "after_backward", "DDPFlat": "after_backward", "DataParallel": "base",
             "broadcast_module_state": "base", "DDPBucketed": "bucketed", "CommHook": "hooks", "GradBucket": "hooks",
             "allreduce_average": "hooks", "DDPIndividualParameters": "individual"}
__all__ = [*_WRAPPERS, "VARIANTS"]


def __getattr__(name: str) -> Any:
    """The wrappers load on first use: importing the benchmark's torch-free config must not import torch."""
    if name == "VARIANTS":
        return {"naive": __getattr__("DDPNaive"), "flat": __getattr__("DDPFlat"),
                "individual": __getattr__("DDPIndividualParameters"), "bucketed": __getattr__("DDPBucketed")}
    if name in _WRAPPERS:
        return getattr(importlib.import_module(f"{__name__}.{_WRAPPERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
