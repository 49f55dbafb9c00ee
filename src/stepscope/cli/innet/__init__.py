"""`stepscope innet switch|bench|timeout-profile|simulate|train`: in-network aggregation as real software.

One module per subcommand, each parsing its options into a config, calling one library function in
`stepscope.innet` (which checks the run, does the work and writes the records) and printing what it returns.
Nothing imports torch until a command that needs it runs.
"""

from __future__ import annotations

import argparse

from stepscope.cli.innet import bench, simulate, switch, timeout_profile, train

SUBCOMMANDS = (switch, bench, timeout_profile, simulate, train)
"""In the order `stepscope innet --help` lists them."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("innet", help="in-network aggregation: switch, bench, timeout profile, "
                                   "simulator, DDP training", description="In-network aggregation (SwitchML / "
                                   "straggler-aware DPA style) as real software over UDP.")
    commands = parser.add_subparsers(dest="innet_command", metavar="SUBCOMMAND", parser_class=type(parser))
    for subcommand in SUBCOMMANDS:
        subcommand.register(commands)
    parser.set_defaults(func=lambda args: _missing_subcommand(parser))


def _missing_subcommand(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
