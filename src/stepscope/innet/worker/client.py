"""The all-reduce client: join a job at a switch, then reduce tensors through it.

    job = InnetJob(JobConfig(switch="127.0.0.1:9000", job_id=7, rank=r, world=4)).join()
    job.all_reduce(tensor, op="avg")             # in place; returns the tensor
    pending = job.submit(tensor, op="sum", k=3)  # asynchronous (batch mode); pending.wait()

or, module-level on one default job: `stepscope.innet.init(...)` then `stepscope.innet.all_reduce(t)`.
A job's settings: `stepscope.innet.worker.config.JobConfig`.

Each op logs one line in the format of the DPA system's logs, e.g.
    innet: new-task allreduce.3 [7087872 x f32] 0x7f12a4000000 > 0x7f12a4000000 4-pipe average quant.1 no-straggle
("quant.1": float32 quantized to int32; "quant.0": raw int32; "straggle-K": fastest-K straggler tolerance).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.innet.wire import protocol as p
from stepscope.innet.worker.config import JobConfig, shared_job_id
from stepscope.innet.worker.engine import RECV_BUFFER_BYTES, Engine, EngineSettings
from stepscope.innet.worker.op import Op
from stepscope.innet.worker.stream import InnetError

logger = logging.getLogger("stepscope.innet")


class Pending:
    """An op in flight; `wait()` returns the reduced tensor (the one passed in, reduced in place)."""

    def __init__(self, job: InnetJob, op: Op, tensor: Any, finish: Callable[[], None] | None) -> None:
        self.job, self.op, self.tensor, self._finish = job, op, tensor, finish

    def done(self) -> bool:
        return self.op.event.is_set()

    def wait(self, timeout_s: float | None = None) -> Any:
        limit = timeout_s if timeout_s is not None else self.job.config.timeout_s * 4 + 60
        if not self.op.event.wait(limit):
            raise InnetError(f"allreduce.{self.op.op_id} did not finish within {limit:g} s")
        if self.op.error is not None:
            raise self.op.error
        if self._finish is not None:
            self._finish()
            self._finish = None
        return self.tensor

    def summary(self) -> dict[str, Any]:
        return self.op.summary()


class InnetJob:
    """A rank's membership in a switch job and its engine."""

    def __init__(self, config: JobConfig, log: Callable[[str], None] | None = None) -> None:
        config.validate()
        self.config = config
        self.log = log or logger.info
        self.engine: Engine | None = None
        self.next_op = 1
        self._in_flight: list[Op] = []  # submitted ops not finished yet (for the overlap check)
        self._refused: str | None = None  # why an op was refused on this rank: the job cannot go on
        self._lock = threading.Lock()

    # ---- membership ---------------------------------------------------------------------------
    def join(self, wait_all: bool = True) -> InnetJob:
        """JOIN the switch (creating the job if this rank is first); with `wait_all`, also wait until
        every rank joined, so no result is multicast before everyone can receive it."""
        cfg = self.config
        socks: list[socket.socket] = []
        try:
            for address in cfg.addresses():  # one socket per switch shard, each joins the job there
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RECV_BUFFER_BYTES)
                try:
                    sock.connect(address)
                except OSError as error:
                    raise InnetError(f"cannot reach the innet switch at {cfg.switch}: "
                                     f"{error.strerror or error}") from None
                sock.setblocking(False)
                self._handshake(sock, wait_all)
        except BaseException:
            for sock in socks:
                sock.close()
            raise
        settings = EngineSettings(
            job_id=cfg.job_id, rank=cfg.rank, world=cfg.world, values_per_packet=cfg.k, slots=cfg.slots,
            window=cfg.resolved_window, rto_s=None if cfg.rto_ms is None else cfg.rto_ms * 1e-3,
            rto_min_s=cfg.rto_min_ms * 1e-3, rto_max_s=cfg.rto_max_ms * 1e-3,
            backoff=cfg.backoff, timeout_s=cfg.timeout_s, sender_threads=cfg.sender_threads,
            stash_limit_bytes=cfg.stash_limit_bytes, faults=cfg.faults, offload=cfg.offload)
        self.engine = Engine(socks, settings)
        return self

    def _handshake(self, sock: socket.socket, wait_all: bool) -> int:
        cfg = self.config
        params = cfg.join_params()
        start = time.monotonic()
        resend_s, first_reply, polls = 0.02, None, 0
        while True:
            flags = p.SYNC if first_reply is not None else 0
            packet = p.pack(p.JOIN, cfg.job_id, 0, 0, 0, cfg.rank, cfg.world, flags, values=params.to_values())
            try:
                sock.send(packet)
                polls += 1
                reply = self._await_joined(sock, resend_s)
            except ConnectionRefusedError:
                raise InnetError(f"innet switch at {cfg.switch} refused the job (nothing listens on that port); "
                                 f"start one with `stepscope innet switch --port {cfg.address()[1]}`") from None
            now = time.monotonic()
            if reply is not None:
                first_reply = first_reply or now
                joined = reply
                if joined >= cfg.world or not wait_all:
                    return joined
                if now - first_reply > cfg.join_timeout_s:
                    raise InnetError(f"only {joined} of {cfg.world} ranks joined job {cfg.job_id} within "
                                     f"{cfg.join_timeout_s:g} s")
                resend_s = 0.01
            elif first_reply is None:
                if now - start > cfg.connect_timeout_s:
                    raise InnetError(f"innet switch at {cfg.switch} did not answer within {cfg.connect_timeout_s:g} s "
                                     f"({polls} JOIN packets sent); is `stepscope innet switch` running there?")
                resend_s = min(resend_s * 2, 0.5)

    def _await_joined(self, sock: socket.socket, wait_s: float) -> int | None:
        """Members joined, from a JOINED reply within `wait_s`; None if none came."""
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                return None
            data = sock.recv(65_536)
            try:
                h = p.unpack(data)
            except p.ProtocolError:
                continue
            if h.type != p.JOINED or h.job != self.config.job_id:
                continue
            values = p.values_of(data, h.count)
            if h.flags & p.BAD:
                code = int(values[0]) if len(values) else 0
                reason = p.REJECT_REASONS.get(code, "rejected")
                if code == 4:  # say how much: the switch's limit is its --max-job-MiB
                    from stepscope.innet.switch.job import SwitchJob

                    need = -(-SwitchJob.memory_bytes(self.config.world, self.config.join_params()) // 2**20)
                    reason += f" (this job needs {need:,} MiB: start the switch with --max-job-MiB {need} or more)"
                raise InnetError(f"the switch rejected job {self.config.job_id}: {reason}")
            return int(values[4]) if len(values) > 4 else 0

    def close(self) -> None:
        """Leave the job (the switch frees it when every rank left) and stop the engine."""
        if self.engine is None:
            return
        engine, self.engine = self.engine, None
        engine.close()
        cfg = self.config
        for sock in engine.socks:
            try:  # best effort: a lost LEAVE only delays the switch's idle cleanup of the job
                sock.send(p.pack(p.LEAVE, cfg.job_id, 0, 0, 0, cfg.rank, cfg.world, 0))
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> InnetJob:
        return self if self.engine is not None else self.join()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- all-reduce ---------------------------------------------------------------------------
    def submit(self, tensor: Any, op: str = "avg", k: int | None = None, preemptive: bool = False,
               callback: Callable[[Op], Any] | None = None) -> Pending:
        """Start reducing `tensor` in place (float32 -> quantized sum or average; int32 -> exact sum with
        int32 wrap-around, or its average: the sum divided by the real contributor count, truncated toward
        zero as C's integer division and NCCL's integer average do).
        `k` is the fastest-K: the switch may complete a block without the slowest ranks once the straggler
        timeout passed and k contributions arrived (None = world: wait for everyone)."""
        if self.engine is None:
            raise InnetError("join() the job before reducing")
        if op not in ("avg", "sum"):
            raise UsageError(f"op must be avg or sum, got {op!r}")
        world = self.config.world
        min_count = world if k is None else k
        if not 1 <= min_count <= world:
            raise UsageError(f"k must be 1..world ({world}), got {k}")
        array, finish = _as_array(tensor)
        with self._lock:  # op ids follow submit order, which every rank must share
            if self._refused is not None:
                raise InnetError(f"{self._refused}: its peers wait for that op, so this job cannot go on")
            op_id = self.next_op
            self.next_op = op_id + 1
            try:
                # an op reads its values while it runs and writes its result in place: a buffer still being
                # reduced cannot be reduced again (gloo and NCCL would order the two; here they would mix)
                self._in_flight = [o for o in self._in_flight if not o.event.is_set()]
                if any(np.may_share_memory(o.array, array) for o in self._in_flight):
                    raise UsageError("this tensor shares memory with one still being reduced: wait for that op")
                job_op = Op(op_id, array, average=op == "avg", min_count=min_count, preemptive=preemptive,
                            values_per_packet=self.config.k, slots=self.config.slots, world=world)
            except (UsageError, ValueError) as error:
                # refused on this rank only (its own values or timing): the op id is spent, as on the other
                # ranks, and every later op here fails at once instead of pairing with another op's id
                self._refused = f"op {op_id} was refused on rank {self.config.rank} ({error})"
                raise
            self._in_flight.append(job_op)
        if callback is not None:
            job_op.callbacks.append(callback)
        self.log(log_line(op_id, array, self.config.pipes, op == "avg", min_count, world, tensor))
        self.engine.submit(job_op)
        return Pending(self, job_op, tensor, finish)

    def all_reduce(self, tensor: Any, op: str = "avg", k: int | None = None, preemptive: bool = False) -> Any:
        """Reduce `tensor` in place across the job and return it (blocking)."""
        return self.submit(tensor, op, k, preemptive).wait()

    def stats(self) -> dict[str, int]:
        """The switch's counters for this job."""
        if self.engine is None:
            raise InnetError("join() the job first")
        return self.engine.request_stats()

    @property
    def counters(self) -> dict[str, int]:
        """This worker's counters (sent, retransmitted, ...) and its injected faults."""
        if self.engine is None:
            return {}
        faults = self.engine.faults.counters
        return {**vars(self.engine.counters), **{f"injected_{k}": v for k, v in vars(faults).items()}}


def _as_array(tensor: Any) -> tuple[np.ndarray, Callable[[], None] | None]:
    """A flat numpy view sharing the tensor's memory (CUDA tensors are staged through host memory)."""
    if isinstance(tensor, np.ndarray):
        if not tensor.flags.c_contiguous:
            raise UsageError("innet all-reduce needs a contiguous array")
        array = tensor.reshape(-1)
    else:
        import torch

        if not isinstance(tensor, torch.Tensor):
            raise UsageError(f"cannot all-reduce a {type(tensor).__name__}")
        if not tensor.is_contiguous():
            raise UsageError("innet all-reduce needs a contiguous tensor")
        if tensor.device.type != "cpu":
            host = tensor.detach().to("cpu")
            return _check_dtype(host.view(-1).numpy()), lambda: tensor.copy_(host)
        array = tensor.detach().view(-1).numpy()
    return _check_dtype(array), None


def _check_dtype(array: np.ndarray) -> np.ndarray:
    if array.dtype not in (np.float32, np.int32):
        raise UsageError(f"innet all-reduce supports float32 and int32, not {array.dtype}")
    return array


def log_line(op_id: int, array: np.ndarray, pipes: int, average: bool, min_count: int, world: int,
             tensor: Any = None) -> str:
    """`innet: new-task allreduce.<id> [<numel> x f32] <src> > <dst> <P>-pipe average quant.1 no-straggle`."""
    address = tensor.data_ptr() if hasattr(tensor, "data_ptr") else array.ctypes.data
    kind = "f32" if array.dtype == np.float32 else "i32"
    tolerance = "no-straggle" if min_count >= world else f"straggle-{min_count}"
    return (f"innet: new-task allreduce.{op_id} [{len(array)} x {kind}] 0x{address:x} > 0x{address:x} "
            f"{pipes}-pipe {'average' if average else 'sum'} quant.{int(array.dtype == np.float32)} {tolerance}")


# ---- a module-level default job -----------------------------------------------------------------------
_default: InnetJob | None = None


def init(switch: str, rank: int | None = None, world: int | None = None, job_id: int | None = None,
         **options: Any) -> InnetJob:
    """Join the default job; rank, world and (when None) a shared job id come from torch.distributed."""
    global _default
    if rank is None or world is None or job_id is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise UsageError("init() needs rank, world and job_id, or an initialized torch.distributed group")
        rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size() if world is None else world
        if job_id is None:
            job_id = shared_job_id()
    shutdown()
    _default = InnetJob(JobConfig(switch=switch, rank=rank, world=world, job_id=job_id, **options)).join()
    return _default


def all_reduce(tensor: Any, op: str = "avg", k: int | None = None, preemptive: bool = False) -> Any:
    """Reduce `tensor` in place through the default job (see `init`)."""
    if _default is None:
        raise InnetError("call stepscope.innet.init(...) before all_reduce")
    return _default.all_reduce(tensor, op=op, k=k, preemptive=preemptive)


def shutdown() -> None:
    global _default
    if _default is not None:
        _default.close()
        _default = None

