"""Errors that mean "the user asked for something invalid" (exit code 2, one line, no traceback)."""


class UsageError(ValueError):
    """Bad input from the user: an unknown preset, an invalid override, an impossible plan, ..."""
