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
"""

from stepscope.distributed.data_parallel.after_backward import DDPFlat, DDPNaive
from stepscope.distributed.data_parallel.base import DataParallel, broadcast_module_state
from stepscope.distributed.data_parallel.bucketed import DDPBucketed
from stepscope.distributed.data_parallel.hooks import CommHook, GradBucket, allreduce_average
from stepscope.distributed.data_parallel.individual import DDPIndividualParameters

VARIANTS = {"naive": DDPNaive, "flat": DDPFlat, "individual": DDPIndividualParameters, "bucketed": DDPBucketed}

__all__ = ["DataParallel", "DDPNaive", "DDPFlat", "DDPIndividualParameters", "DDPBucketed", "GradBucket",
           "CommHook", "allreduce_average", "broadcast_module_state", "VARIANTS"]
