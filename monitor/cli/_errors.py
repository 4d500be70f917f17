"""The one error a CLI handler raises for bad input: printed as one line, exit code 2."""

from __future__ import annotations


class CommandError(Exception):
    """Bad input or an unmet precondition, explained in one line."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
