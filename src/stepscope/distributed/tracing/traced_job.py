"""The program a traced run executes under strace (`tally.trace_run`):

    python -m stepscope.distributed.tracing.traced_job MODULE:FUNCTION PLAN.json OUT_DIR

calls `FUNCTION(config, OUT_DIR)`, the config rebuilt from the JSON plan (`plan`) as the type FUNCTION's first
parameter is annotated with; the ranks it starts mark their timed calls (`windows.window_marker`, switched on by
the environment the parent set). FUNCTION is a benchmark's library function (`run_comm`, innet's `run_bench`):
it writes its records to OUT_DIR as it always does."""

from __future__ import annotations

import importlib
import inspect
import sys
import typing
from pathlib import Path

from stepscope.distributed.tracing.plan import plan_from_json


def main(argv: list[str]) -> int:
    target, plan_path, out_dir = argv
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    first = next(iter(inspect.signature(function).parameters))
    config = plan_from_json(typing.get_type_hints(function)[first], Path(plan_path).read_text())
    function(config, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
