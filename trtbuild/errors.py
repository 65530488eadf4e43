"""Errors the CLI reports as one line, without a traceback.

`UserError` is bad input (recipe, paths, flags): exit code 2.
`BuildError` is a build that ran and failed a check (accuracy gate, compatibility): exit code 1.
"""

from __future__ import annotations


class TrtbuildError(Exception):
    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        field = f"{self.field}: " if self.field else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        text = f"{where}{field}{self.message}{fix}"
        return " ".join(text.split())  # always one line


class UserError(TrtbuildError):
    exit_code = 2


class BuildError(TrtbuildError):
    exit_code = 1
