"""In-network aggregation (SwitchML / straggler-aware "DPA" style) as real software, by role:

- `wire`: the versioned packet format (`protocol`), float32 <-> int32 quantization (`quantize`), many datagrams
  per system call (`batch_io` over `mmsg`: recvmmsg/sendmmsg, UDP segmentation offload), and which data path
  runs (`fastpath`: stepscope's C extension `_fastpath`, built from `csrc/` at install time, or numpy);
- `switch`: the software switch (`server`: socket, batches, `table` of jobs; `job`: slots, versions, bitmaps,
  timers, counters as arrays; `aggregate`: a batch of contributions at once; `fast_batch`: the same through C;
  `outbox`: what a batch sends), its
  settings (`config`), the switch as processes (`process`: `run_switch`, `SwitchProcess`, `probe`; `shards`);
- `worker`: the all-reduce client (`client`, its settings `config`, `engine`, `links`, `window`, `stream`, `op`,
  `rto`), fault injection (`faults`) and a DDP communication hook (`ddp_hook`, imports torch);
- `sim`: a discrete-event model of the protocol at line rate (`model`, `config`, `sweep`);
- `runs`: the commands' library functions, each writing its own records: `bench`, `timeout_profile`, `train`
  (started through `runner`), `switch_bench` (with its packet `generator`), with `reference` (inputs every rank
  can regenerate, and the checks).

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
