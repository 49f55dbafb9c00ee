"""The program `innet.runs.syscall_tally` runs under strace:
`python -m stepscope.innet.runs.syscall_job PLAN.pkl OUT_DIR` runs the pickled BenchConfig (written by the
parent a moment before) with its own switch, records in OUT_DIR."""

from __future__ import annotations

import pickle
import sys


def main(argv: list[str]) -> int:
    from stepscope.innet.runs.bench import run_bench

    plan_path, out_dir = argv
    with open(plan_path, "rb") as handle:
        config = pickle.load(handle)  # noqa: S301 - written by this program's parent, never user input
    run_bench(config, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
