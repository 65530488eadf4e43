"""`trtbuild demo`."""

from __future__ import annotations

import click

from trtbuild.cli.common import bench_dir, built, cli, set_option
from trtbuild.core.errors import UserError
from trtbuild.runtime.bench import chat_requests
from trtbuild.serve.commands import demo as run_demo


@cli.command()
@click.argument("recipe")
@set_option
@click.option("--max-tokens", type=int, default=32, show_default=True)
def demo(recipe: str, overrides: tuple[str, ...], max_tokens: int) -> None:
    """Serve the built deployment on free ports, answer one request, print a load-test table, stop."""
    loaded, artifacts = built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    # A chat model's bench prompts (a chat .jsonl) are what the demo asks it, through its chat template.
    chats = chat_requests(loaded.bench.prompts, loaded.base_dir) if loaded.bench else []
    run_demo(artifacts["deploy"], max_tokens=max_tokens, echo=click.echo, out_dir=bench_dir(loaded), chats=chats)
