"""User-facing errors: one line that names the fix, then a non-zero exit."""


class UserError(Exception):
    """Bad input the user can fix; printed as a single line, never a traceback."""

    exit_code = 2
