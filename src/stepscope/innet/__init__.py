"""In-network aggregation (SwitchML / straggler-aware "DPA" style) as real software.

- `protocol`: the versioned binary packet format; `quantize`: float32 <-> int32 with shared exponents.
- `switch` / `switch_job`: the software switch (slots, versions, bitmaps, straggler timers, counters);
  `switch_process`: the switch as a separate process.
- `worker` (+ `job_config`, `worker_engine`, `worker_op`, `rto`): the all-reduce client; `faults`: fault
  injection.
- `ddp_hook`: a DDP communication hook (imports torch); `bench`, `timeout_profile`, `train` (run through
  `runner`), `sim_sweep` (over `simulator`, a discrete-event model of the protocol at line rate) and
  `switch_process.run_switch`: the commands' library functions, each writing its own records.

    from stepscope import innet
    innet.init("127.0.0.1:9000", rank=r, world=n, job_id=7)   # or rank/world/job id from torch.distributed
    innet.all_reduce(tensor, op="avg", k=None)                # k: fastest-K (None = wait for every rank)
"""

from stepscope.innet.job_config import JobConfig
from stepscope.innet.switch import Switch, SwitchConfig
from stepscope.innet.worker import InnetJob, Pending, all_reduce, init, log_line, shutdown
from stepscope.innet.worker_stream import InnetError

__all__ = ["Switch", "SwitchConfig", "InnetJob", "JobConfig", "Pending", "InnetError", "all_reduce", "init",
           "shutdown", "log_line"]
