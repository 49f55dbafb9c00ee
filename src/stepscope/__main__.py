"""`python -m stepscope` is the `stepscope` command."""

from stepscope.cli.main import entry_point

entry_point()
