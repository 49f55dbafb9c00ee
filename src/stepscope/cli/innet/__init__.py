"""`stepscope innet switch|switch-bench|bench|timeout-profile|simulate|train`: in-network aggregation as real software.

One module per subcommand, each parsing its options into a config, calling one library function in
`stepscope.innet` (which checks the run, does the work and writes the records) and printing what it returns.
Nothing imports torch until a command that needs it runs.
"""

from __future__ import annotations

import argparse

from stepscope.cli.innet import bench, simulate, switch, switch_bench, timeout_profile, train
from stepscope.cli.options import add_command, add_subcommands

NAME = "innet"
HELP = "in-network aggregation: switch, switch bench, bench, timeout profile, simulator, DDP training"
DESCRIPTION = "In-network aggregation (SwitchML / straggler-aware DPA style) as real software over UDP."


SUBCOMMANDS = (switch, switch_bench, bench, timeout_profile, simulate, train)
"""In the order `stepscope innet --help` lists them."""


def add_options(parser: argparse.ArgumentParser) -> None:
    """The subcommands (a group command has no `run` of its own)."""
    commands = add_subcommands(parser, "innet_command", "SUBCOMMAND")
    for subcommand in SUBCOMMANDS:
        add_command(commands, subcommand)
