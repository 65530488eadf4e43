"""`trtbuild schema`."""

from __future__ import annotations

import click

from trtbuild.app.recipe import Recipe
from trtbuild.app.reference_doc import render
from trtbuild.cli.common import cli, print_json


@cli.command()
@click.option("--markdown", is_flag=True, help="The recipe reference as Markdown (docs/recipe-reference.md).")
def schema(markdown: bool) -> None:
    """Print the recipe schema (JSON Schema, or the Markdown reference)."""
    model = Recipe
    if markdown:
        click.echo(render(model), nl=False)
    else:
        print_json(model.model_json_schema())
