"""What the commands share: the click group, the --set option, loading a recipe, the cache, the
output helpers, and `built` (build up to a stage and lease what is served or measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from trtbuild.app import pipeline
from trtbuild.app.preflight import preflight
from trtbuild.app.recipe import Recipe, load_recipe
from trtbuild.core.cache import ArtifactCache
from trtbuild.core.progress import Progress
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.safepaths import ensure_inside, mark_output_dir

set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                           help="Override a recipe field, e.g. --set quantize.gate.max_perplexity_ratio=1.05")


def load(recipe_path: str, overrides: tuple[str, ...]) -> Recipe:
    return load_recipe(recipe_path, list(overrides))


def artifact_cache() -> ArtifactCache:
    return ArtifactCache()


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def stage_table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("stage", "status", "key", "seconds", "why / metrics"):
        table.add_column(column)
    for row in rows:
        metrics = ", ".join(f"{k}={fmt(v)}" for k, v in list(row["metrics"].items())[:6])
        detail = row["reason"] if row["status"] != "ran" and row["status"] != "cached" or not metrics else metrics
        if row["status"] == "cached" and metrics:
            detail = metrics
        table.add_row(row["name"], row["status"], (row["key"] or "")[:12],
                      fmt(row["seconds"]) if row["seconds"] is not None else "", detail)
    Console().print(table)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trtbuild")
def cli() -> None:
    """Build an FP8 + EAGLE-3 TensorRT-LLM deployment from one YAML recipe."""


def built(recipe: str, overrides: tuple[str, ...], until: str, progress_enabled: bool) -> tuple[Recipe, dict[str, Path]]:
    """Build (usually all cached) up to `until`; return the recipe and {stage: artifact path}."""
    loaded = load(recipe, overrides)
    preflight(loaded)
    store = artifact_cache()
    steps = pipeline.build(loaded, store, Progress.for_terminal(enabled=progress_enabled), until=until)
    artifacts = {s.name: s.artifact for s in steps if s.artifact is not None}
    # What is served or measured from here on stays leased until this process ends: `cache gc` and
    # `clean --cache` skip these entries.
    LEASES.extend(fd for fd in (store.lease(path) for path in artifacts.values()) if fd is not None)
    return loaded, artifacts


LEASES: list[int] = []  # lock file descriptors, released by the process's exit


def bench_dir(loaded: RecipeInfo) -> Path:
    """<output_dir>/bench, proven to stay inside the output dir (a planted symlink is refused)."""
    mark_output_dir(loaded.output_path)
    return ensure_inside(loaded.output_path / "bench", [loaded.output_path], "write into")
