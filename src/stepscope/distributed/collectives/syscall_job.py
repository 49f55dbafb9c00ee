"""The program `syscall_tally` runs under strace: one job of a `comm` request (`python -m
stepscope.distributed.collectives.syscall_job PLAN.json OUT_DIR`), its records written to OUT_DIR. The
ranks mark each point's timed calls (`tracing.windows`, switched on by the environment the parent sets)."""

from __future__ import annotations

import json
import sys

from stepscope.distributed.collectives.config import CommConfig


def main(argv: list[str]) -> int:
    plan_path, out_dir = argv
    with open(plan_path) as handle:
        fields = json.load(handle)
    config = CommConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    from stepscope.distributed.collectives.session import run_comm

    run_comm(config, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
