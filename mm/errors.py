"""Errors a user can fix. CLIs print them as one line on stderr and exit 2."""


class UserError(Exception):
    """Bad input, config or state; the message says what, why and how to fix it."""
