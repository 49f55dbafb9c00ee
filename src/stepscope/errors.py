"""The two ways a command fails on purpose, at the bottom of the import graph (every package may raise them).

- `UsageError`: the user asked for something invalid: exit code 2, one line, no traceback.
- `DistributedError`: a distributed run failed (a rank raised or died, no process group formed, an MPI job
  stopped): exit code 1 with the failing rank's message and the tail of its traceback, never a hang.
"""


class UsageError(ValueError):
    """Bad input from the user: an unknown preset, an invalid override, an impossible plan, ..."""


class DistributedError(RuntimeError):
    """A distributed run failed; `rank` is the first failing rank (-1: unknown), `details` the tail of its
    traceback."""

    def __init__(self, message: str, *, rank: int = -1, details: str = "") -> None:
        super().__init__(message)
        self.rank, self.details = rank, details

    @classmethod
    def of_rank(cls, rank: int, message: str, details: str = "") -> "DistributedError":
        """`rank R failed: <message>`: the error a failing rank reports."""
        return cls(f"rank {rank} failed: {message}", rank=rank, details=details)


class RendezvousError(DistributedError):
    """Under torchrun/Slurm the process group could not be formed (one line: what to check)."""
