"""Progress reporting for long work: rich progress bars on a TTY, silent otherwise.

Stages receive a `Progress` and never import rich themselves, so `--json` and non-TTY runs
print nothing but their result.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class Task:
    """One bar. `advance(n, **fields)` moves it; fields (loss=..., acc=...) are shown beside it."""

    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._progress = progress
        self._id = task_id

    def advance(self, n: float = 1, **fields: Any) -> None:
        self._progress._advance(self._id, n, fields)

    def update(self, **fields: Any) -> None:
        self._progress._advance(self._id, 0, fields)


class Progress:
    """Quiet by default; `Progress.for_terminal()` gives rich bars when stderr is a TTY."""

    def __init__(self) -> None:
        self._rich: Any = None

    @staticmethod
    def for_terminal(enabled: bool = True) -> Progress:
        if enabled and sys.stderr.isatty():
            return RichProgress()
        return Progress()

    def log(self, message: str) -> None:
        """A line of status for the user (stderr, so stdout stays machine-readable)."""

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        yield Task(self, None)

    def track(self, items: Iterable[T], description: str, total: float | None = None) -> Iterator[T]:
        if total is None and hasattr(items, "__len__"):
            total = len(items)  # type: ignore[arg-type]
        with self.task(description, total) as bar:
            for item in items:
                yield item
                bar.advance()

    def _advance(self, task_id: Any, n: float, fields: dict[str, Any]) -> None:
        pass


def _format_fields(fields: dict[str, Any]) -> str:
    parts = []
    for key, value in fields.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


class RichProgress(Progress):
    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self._console = Console(stderr=True)

    def log(self, message: str) -> None:
        self._console.print(message, highlight=False)

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        from rich import progress as rp

        bar = rp.Progress(
            rp.TextColumn("[bold]{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            rp.TimeRemainingColumn(),
            rp.TextColumn("{task.fields[info]}"),
            console=self._console,
            transient=False,
        )
        with bar:
            task_id = bar.add_task(description, total=total, info="")
            self._rich = bar
            try:
                yield Task(self, task_id)
            finally:
                self._rich = None

    def _advance(self, task_id: Any, n: float, fields: dict[str, Any]) -> None:
        if self._rich is None:
            return
        if fields:
            self._rich.update(task_id, advance=n, info=_format_fields(fields))
        else:
            self._rich.update(task_id, advance=n)
