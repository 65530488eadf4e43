"""Errors the CLI reports as one line, without a traceback.

`UserError` is bad input (recipe, paths, flags): exit code 2.
`BuildError` is a build that ran and failed a check (accuracy gate, compatibility): exit code 1.
"""

from __future__ import annotations

import os


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


def wrapped_os_error(exc: BaseException, path: str | None = None) -> OSError | None:
    """The OSError a library reported as its own exception, else None: safetensors' Rust writer
    raises SafetensorError("... I/O error: No space left on device (os error 28)") on a full disk."""
    import errno as errno_module
    import re

    if isinstance(exc, OSError):
        return exc
    if type(exc).__name__ != "SafetensorError":
        return None
    found = re.search(r"\(os error (\d+)\)", str(exc))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code) if code in errno_module.errorcode else str(exc), path)


def os_error(exc: OSError, *, written: int | None = None, where: str | None = None) -> TrtbuildError:
    """An OSError as one line: the path, what the system said, and for a full disk the free space
    there and how much more is needed (at least what the step had written when the disk filled).
    `where` is the directory being written (the stage's work dir): for a full disk it names the disk,
    where the failing call may name its source file."""
    import errno
    import shutil
    from pathlib import Path

    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    path = (where if full and where else None) or exc.filename or where or "?"
    message = f"{path}: {exc.strerror or exc}"
    if not full:
        return UserError(message, fix="check the path's permissions and the disk")
    probe = Path(str(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        have = f"{_size(shutil.disk_usage(probe).free)} free on that filesystem"
    except OSError:
        have = "free space unknown"
    need = f"; the step had written {_size(written)} when the disk filled: free at least that much more" \
        if written else ""
    return UserError(f"{message} ({have}{need}); nothing half-written was kept",
                     fix="free disk space, or point TRTBUILD_CACHE / output_dir at a larger disk")


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} bytes"
