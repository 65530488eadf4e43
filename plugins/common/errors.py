"""The error bad plugin input raises: trtbuild's UserError (one line, exit 2) in the repository's
`plugins` package, a ValueError with the same keywords in the copy an engine bundle ships (imported
by TensorRT-LLM's server, where trtbuild is neither needed nor imported)."""

from __future__ import annotations

if __package__ == "plugins.common":
    from trtbuild.core.errors import UserError
else:  # the bundle's copy

    class UserError(ValueError):  # type: ignore[no-redef]
        def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                     field: str | None = None, fix: str | None = None) -> None:
            self.message, self.file, self.line, self.field, self.fix = message, file, line, field, fix
            super().__init__(f"{field + ': ' if field else ''}{message}{f' (fix: {fix})' if fix else ''}")

__all__ = ["UserError"]
