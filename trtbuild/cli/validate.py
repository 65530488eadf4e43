"""`trtbuild validate`."""

from __future__ import annotations

import click

from trtbuild.app.preflight import preflight
from trtbuild.cli.common import cli, load, set_option


@cli.command()
@click.argument("recipe")
@set_option
def validate(recipe: str, overrides: tuple[str, ...]) -> None:
    """Check a recipe (schema, files, cross-stage consistency) without doing any work."""
    loaded = load(recipe, overrides)
    preflight(loaded)
    click.echo(f"{recipe}: ok ({loaded.name})")
