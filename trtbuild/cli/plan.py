"""`trtbuild plan`."""

from __future__ import annotations

import click

from trtbuild.app import pipeline
from trtbuild.app.gpu_plan import plan_notes
from trtbuild.app.preflight import preflight
from trtbuild.app.target_structure import structure_notes
from trtbuild.cli.common import artifact_cache, cli, load, print_json, set_option, stage_table
from trtbuild.deploy import dynamo as dynamo_deploy
from trtbuild.draft import plan_notes as draft_notes
from trtbuild.engine import plugin_module
from trtbuild.model.source import target_hf_config


@cli.command()
@click.argument("recipe")
@set_option
@click.option("--until", default=None, help="Plan up to this stage.")
@click.option("--force", multiple=True, help="Plan a rebuild of this stage (and what reads it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...], as_json: bool) -> None:
    """Show what a build would run, what is cached, and why. Touches nothing."""
    loaded = load(recipe, overrides)
    preflight(loaded)
    steps = pipeline.plan(loaded, artifact_cache(), until=until, force=force)
    data = pipeline.report(loaded, steps, executed=False)

    found = target_hf_config(loaded)

    data["notes"] = (plan_notes(loaded) + plugin_module.plan_notes(loaded, found[0] if found else None)
                     + structure_notes(loaded) + draft_notes.plan_notes(loaded, steps) + dynamo_deploy.plan_notes(loaded))
    if as_json:
        print_json(data)
    else:
        stage_table(f"plan: {loaded.name} -> {data['output_dir']}", data["stages"])
        for line in data["notes"]:
            click.echo(line)
