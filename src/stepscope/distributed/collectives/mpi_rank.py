"""The mpi4py op table and the program every rank runs under mpiexec (`python -m
stepscope.distributed.collectives.mpi_rank PLAN.json`); started by `mpi_job.run_mpi`, never by hand. No torch
here: numpy buffers, so the numbers are MPI's own. Rank 0 reports a `point` event per point (the record,
already appended to the store, plus every rank's raw tally); `launch.mpi.rank_main` reports `done` or a
rank's `error` (and aborts the job).

In-place forms are MPI's: MPI_IN_PLACE for all_reduce, all_gather, reduce_scatter (result in the
first chunk), all_to_all and reduce (on the root); broadcast exists only in place. all_to_allv is
MPI_Alltoallv out of place only: with MPI_IN_PLACE a rank sends what recvcounts say it receives, which
an uneven split (a hot receiver) is not.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from stepscope.distributed.collectives.ops import SENTINEL, checked_on, expected_values, input_values
from stepscope.distributed.collectives.points import CommPoint
from stepscope.distributed.collectives.rank import Prepared, chunks, run_points
from stepscope.distributed.collectives.splits import displacements
from stepscope.distributed.collectives.tally import MpiTally
from stepscope.distributed.launch.mpi import emit, rank_main

NUMPY_DTYPES = {"fp32": np.float32, "fp16": np.float16, "fp64": np.float64, "int8": np.int8, "uint8": np.uint8,
                "int32": np.int32, "int64": np.int64}


class MpiCommunicator:
    """mpi4py calls on one rank: a duplicated COMM_WORLD measured, another for control messages."""

    backend = "mpi"

    def __init__(self, MPI: Any) -> None:
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD.Dup()
        self.control = MPI.COMM_WORLD.Dup()
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.tally = MpiTally()

    # ---- the op table ----------------------------------------------------------------------------
    def unsupported(self, point: CommPoint) -> str | None:
        if point.dtype not in NUMPY_DTYPES:
            return f"MPI has no {point.dtype} datatype"
        if point.op == "broadcast" and point.in_place is False:
            return "MPI_Bcast works in place only"
        if point.op == "all_to_allv" and point.in_place:
            return "MPI_Alltoallv in place sends what it receives (recvcounts both ways): no uneven split"
        return None

    def prepare(self, point: CommPoint) -> Prepared:
        MPI, comm, call = self.MPI, self.comm, self.tally.call
        lay, op, rank, n, root = point.layout(), point.op, self.rank, self.world_size, point.root
        if op == "barrier":
            return Prepared(lambda a: call("MPI_Ibarrier", comm.Ibarrier) if a else call("MPI_Barrier", comm.Barrier))
        dtype = NUMPY_DTYPES[point.dtype]
        chunk, in_place, itemsize = lay.chunk, bool(point.in_place), np.dtype(dtype).itemsize
        send_bytes, recv_bytes = lay.send_count * itemsize, lay.recv_count_of(rank) * itemsize

        def inp(idx: Any) -> Any:
            return input_values(op, idx, rank)

        def out(idx: Any) -> Any:
            return expected_values(op, idx, rank, n, chunk, root, splits=lay.splits)

        def start(blocking: str, nonblocking: str, *args: Any) -> Any:
            method = getattr(comm, blocking)
            return lambda a: call(f"MPI_{nonblocking if a else blocking}", getattr(comm, nonblocking) if a else method,
                                  *args, send_bytes=send_bytes, recv_bytes=recv_bytes)

        place = MPI.IN_PLACE
        if op == "broadcast":
            buf = np.empty(lay.count, dtype)
            return Prepared(start("Bcast", "Ibcast", buf, root), inputs=[(buf, inp)], outputs=[(buf, out)])
        if op in ("all_reduce", "reduce"):
            if in_place:
                send = recv = np.empty(lay.count, dtype)
                source = place if (op == "all_reduce" or rank == root) else send
            else:
                send, recv = np.empty(lay.count, dtype), np.empty(lay.count, dtype)
                source = send
            outputs = [(recv, out)] if checked_on(op, rank, root) else []
            if op == "all_reduce":
                starter = start("Allreduce", "Iallreduce", source, recv, MPI.SUM)
            else:
                starter = start("Reduce", "Ireduce", source, recv if rank == root else None, MPI.SUM, root)
            return Prepared(starter, inputs=[(send, inp)], outputs=outputs)
        if op == "all_gather":
            recv = np.empty(lay.recv_count, dtype)
            send = recv[rank * chunk:(rank + 1) * chunk] if in_place else np.empty(chunk, dtype)
            return Prepared(start("Allgather", "Iallgather", place if in_place else send, recv),
                            inputs=[(send, inp)], outputs=[(recv, out)])
        if op == "reduce_scatter":
            send = np.empty(lay.send_count, dtype)
            recv = send[:chunk] if in_place else np.empty(chunk, dtype)  # MPI puts the in-place result first
            return Prepared(start("Reduce_scatter_block", "Ireduce_scatter_block", place if in_place else send,
                                  send if in_place else recv, MPI.SUM),
                            inputs=[(send, inp)], outputs=[(recv, out)])
        if op == "all_to_all":
            send = np.empty(lay.send_count, dtype)
            recv = send if in_place else np.empty(lay.recv_count, dtype)
            return Prepared(start("Alltoall", "Ialltoall", place if in_place else send, recv),
                            inputs=[(send, inp)], outputs=[(recv, out)])
        if op == "all_to_allv":
            sends, receives = lay.send_splits(rank), lay.recv_splits(rank)
            send, recv = np.empty(sum(sends), dtype), np.empty(sum(receives), dtype)
            return Prepared(start("Alltoallv", "Ialltoallv", [send, (sends, displacements(sends))],
                                  [recv, (receives, displacements(receives))]),
                            inputs=[(send, inp)], outputs=[(recv, out)])
        raise KeyError(op)

    def wait(self, handles: list[Any]) -> None:
        requests = [h for h in handles if h is not None]
        if requests:
            self.tally.call("MPI_Waitall", self.MPI.Request.Waitall, requests)

    def sync(self) -> None:
        """Host memory only: a completed MPI call has finished its data movement."""

    # ---- data ------------------------------------------------------------------------------------
    def fill(self, view: np.ndarray, values: Any) -> None:
        if values is None:
            view.fill(SENTINEL)
            return
        for start, stop in chunks(view.size):
            view[start:stop] = values(np.arange(start, stop, dtype=np.int64)).astype(view.dtype)

    def count_wrong(self, view: np.ndarray, expected: Any) -> int:
        return sum(int(np.count_nonzero(view[start:stop] != expected(np.arange(start, stop, dtype=np.int64))
                                        .astype(view.dtype)))
                   for start, stop in chunks(view.size))

    # ---- control channel -----------------------------------------------------------------------------
    def control_barrier(self) -> None:
        self.control.Barrier()

    def gather_float(self, value: float) -> list[float]:
        return [float(v) for v in self.control.allgather(float(value))]

    def agree_max(self, value: int) -> int:
        return int(self.control.allreduce(int(value), op=self.MPI.MAX))

    def agree_sum(self, value: int) -> int:
        return int(self.control.allreduce(int(value), op=self.MPI.SUM))

    def is_oom(self, error: BaseException) -> bool:
        return isinstance(error, MemoryError)

    def tally_start(self, point: CommPoint) -> None:
        self.tally.start()

    def tally_stop(self) -> dict[str, Any]:
        return self.tally.stop()

    def environment(self) -> dict[str, Any]:
        import socket

        import mpi4py

        from stepscope.host import cpu_model
        from stepscope.results.environment import base_environment

        env = base_environment()
        env.update({"backend": "mpi", "device": "cpu", "device_name": cpu_model(), "world_size": self.world_size,
                    "mpi_library": self.MPI.Get_library_version().strip().splitlines()[0],
                    "mpi4py": mpi4py.__version__, "numpy": np.__version__})
        env["ranks"] = self.control.allgather({"host": socket.gethostname(), "pid": os.getpid(), "device": "cpu"})
        return env


def measure(MPI: Any, plan: dict[str, Any]) -> None:
    """One rank's part of the sweep in `plan` (points, out_dir, tally); rank 0 reports each point."""
    points = [CommPoint(**p) for p in plan["points"]]
    comm = MpiCommunicator(MPI)

    def report(record: dict[str, Any], raw_tally: dict[str, Any] | None) -> None:
        tallies = comm.control.gather(raw_tally, root=0) if plan.get("tally") else None
        if comm.rank == 0:
            emit("point", record=record, tallies=tallies)

    run_points(comm, points, out_dir=plan.get("out_dir"), tally=bool(plan.get("tally")), on_record=report)


if __name__ == "__main__":
    sys.exit(rank_main(measure))
