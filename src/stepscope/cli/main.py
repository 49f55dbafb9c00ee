"""The `stepscope` command: builds the parser from the command modules and maps errors to exit codes.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback); 130 interrupted (finished
points stay in the record store). Command modules import torch lazily, so `stepscope show` is quick.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from stepscope.errors import DistributedError, UsageError
from stepscope.results.files import remove_created

COMMANDS = ("step", "profile", "memory", "attention", "op_rates", "comm", "ddp", "moe", "predict", "plan", "calibrate",
            "compare", "validate", "trace", "innet", "precision", "show", "report", "models")
"""The command modules of this package, in the order `--help` lists them (a module's NAME is the command:
`op_rates` is `op-rates`). Each defines NAME, HELP, DESCRIPTION,
`add_options(parser)` and `run(args)` (see `stepscope.cli.options.add_command`)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (no usage dump) and exit code 2, and no
    abbreviated options (`--n-layer` must not silently mean `--n-layers`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser(command: str | None = None) -> Parser:
    """The parser of every command, or of `command` alone: a command's parser imports its module and that module's
    option families (the performance model's, the in-network ones), so a run builds only the one it runs."""
    from stepscope import __version__
    from stepscope.cli.options import add_command

    parser = Parser(prog="stepscope", description="Measure, model and speed up transformer training steps.")
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in (command,) if command in COMMANDS else COMMANDS:
        add_command(subparsers, importlib.import_module(f"stepscope.cli.{name}"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0, 1 a rank failed, 2 bad input, 130 interrupted)."""
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as error:
        remove_created()  # a refused command leaves no empty folder or record file behind
        print(f"stepscope: error: {error}", file=sys.stderr)
        return 2
    except DistributedError as error:
        remove_created()
        # a rank failed: its error and the tail of its traceback, and a non-zero exit (never a hang)
        print(f"stepscope: error: {error}", file=sys.stderr)
        if getattr(error, "details", ""):
            print(error.details.rstrip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        return 0
    except Exception as error:
        # a Ctrl-C inside an import can surface wrapped (a class body raising it under `__set_name__` becomes
        # "RuntimeError: Error calling __set_name__"); it is still the user's Ctrl-C, not a crash
        if _caused_by_ctrl_c(error):
            return _interrupted()
        raise


def _interrupted() -> int:
    print("stepscope: interrupted; finished points are kept in the record store", file=sys.stderr)
    return 130


def _caused_by_ctrl_c(error: BaseException) -> bool:
    """True when a KeyboardInterrupt is among the errors that led to `error`."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def entry_point() -> NoReturn:
    """The `stepscope` program (console script and `python -m stepscope`)."""
    code = main()
    # the work is over and its exit code decided: a Ctrl-C arriving during interpreter shutdown must not
    # turn it into a death by SIGINT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130:
        # CPython remembers a KeyboardInterrupt that escaped any code run through PyRun_* (some extension
        # imports do) even when our handler caught it later, and then kills itself with SIGINT after
        # finalizing (Py_RunMain's _Py_UnhandledKeyboardInterrupt): exit 130 without finalizing instead;
        # every finished point is already on disk
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
