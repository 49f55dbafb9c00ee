"""Options of the commands that start ranks (`comm`, `ddp`, `moe`): the backend, how long a rank may wait on a peer,
and whether more local ranks than the machine's limit may start. Defaults come from each command's config."""

from __future__ import annotations

import argparse

from stepscope.cli.options import add_alias, config_default
from stepscope.distributed.launch.ranks import MAX_RANKS_PER_CORE


def add_launch_options(group: argparse._ArgumentGroup | argparse.ArgumentParser, config: type, *, backends: str,
                       backend_field: str = "backend", timeout_help: str = "seconds a rank may wait on a peer") -> None:
    """`--backend`, `--timeout-s` (formerly `--timeout`) and `--oversubscribe`, with defaults from dataclass
    `config`."""
    group.add_argument("--backend", default=config_default(config, backend_field),
                       help=f"{backends} (default %(default)s)")
    group.add_argument("--timeout-s", default=config_default(config, "timeout_s"),
                       help=f"{timeout_help} before the run is stopped (default %(default)s)")
    add_alias(group, "--timeout", "--timeout-s")
    group.add_argument("--oversubscribe", action="store_true", help="start more local ranks than the limit of "
                       f"{MAX_RANKS_PER_CORE} per CPU core (ranks started by torchrun/srun are not limited)")
