"""In-network aggregation (SwitchML / straggler-aware "DPA" style) as real software, by role:

- `wire`: the versioned packet format (`protocol`) and float32 <-> int32 quantization (`quantize`);
- `switch`: the software switch (`server`: socket and job table; `job`: slots, versions, bitmaps, straggler
  timers, counters) and the switch as a separate process (`process`: `run_switch`, `SwitchProcess`, `probe`);
- `worker`: the all-reduce client (`client`, its settings `config`, `engine`, `stream`, `op`, `rto`), fault
  injection (`faults`) and a DDP communication hook (`ddp_hook`, imports torch);
- `sim`: a discrete-event model of the protocol at line rate (`model`, `config`, `sweep`);
- `runs`: the commands' library functions, each writing its own records: `bench`, `timeout_profile`, `train`
  (started through `runner`), with `reference` (inputs every rank can regenerate, and the checks).

Imports point down this list: wire <- switch, worker, sim <- runs.

    from stepscope import innet
    innet.init("127.0.0.1:9000", rank=r, world=n, job_id=7)   # or rank/world/job id from torch.distributed
    innet.all_reduce(tensor, op="avg", k=None)                # k: fastest-K (None = wait for every rank)
"""

from stepscope.innet.switch.config import SwitchConfig
from stepscope.innet.switch.server import Switch
from stepscope.innet.worker.client import InnetJob, Pending, all_reduce, init, log_line, shutdown
from stepscope.innet.worker.config import JobConfig
from stepscope.innet.worker.stream import InnetError

__all__ = ["Switch", "SwitchConfig", "InnetJob", "JobConfig", "Pending", "InnetError", "all_reduce", "init",
           "shutdown", "log_line"]
