"""`trtbuild build` and the one-stage shortcuts (`trtbuild model` ... `trtbuild deploy`)."""

from __future__ import annotations

import time

import click

from trtbuild.app import pipeline
from trtbuild.app.preflight import preflight
from trtbuild.cli.common import artifact_cache, cli, load, print_json, set_option, stage_table
from trtbuild.core.progress import Progress


def _build(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...],
           as_json: bool) -> None:
    started = time.perf_counter()
    loaded = load(recipe, overrides)
    preflight(loaded)
    progress = Progress.for_terminal(enabled=not as_json)
    try:
        steps = pipeline.build(loaded, artifact_cache(), progress, until=until, force=force)
    except Exception as exc:
        failed_steps = getattr(exc, "build_steps", None)
        if as_json and failed_steps is not None:  # CI reads why from the report; the error goes to stderr too
            data = pipeline.report(loaded, failed_steps, executed=True)
            data["wall_seconds"] = round(time.perf_counter() - started, 3)
            print_json(data)
        raise
    data = pipeline.report(loaded, steps, executed=True)
    data["wall_seconds"] = round(time.perf_counter() - started, 3)
    if as_json:
        print_json(data)
    else:
        stage_table(f"build: {loaded.name} -> {data['output_dir']}", data["stages"])


@cli.command()
@click.argument("recipe")
@set_option
@click.option("--until", default=None, help="Stop after this stage.")
@click.option("--force", multiple=True, help="Rebuild this stage and the stages that read it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (no progress bars).")
def build(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...], as_json: bool) -> None:
    """Run the recipe's stages, reusing cached artifacts."""
    _build(recipe, overrides, until, force, as_json)


def _until_command(stage: str) -> None:
    @cli.command(name=stage, help=f"Build up to the {stage} stage (same as `build --until {stage}`).")
    @click.argument("recipe")
    @set_option
    @click.option("--force", multiple=True, help="Rebuild this stage and the stages that read it.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    def command(recipe: str, overrides: tuple[str, ...], force: tuple[str, ...], as_json: bool) -> None:
        _build(recipe, overrides, stage, force, as_json)


for _stage in ("model", "quantize", "draft", "engine", "deploy"):
    _until_command(_stage)
