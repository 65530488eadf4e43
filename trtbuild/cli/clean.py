"""`trtbuild clean`."""

from __future__ import annotations

import click

from trtbuild.cli.common import artifact_cache, cli, load, set_option
from trtbuild.core.safepaths import clean_output_dir


@cli.command()
@click.argument("recipe")
@set_option
@click.option("--cache", "with_cache", is_flag=True, help="Also drop this recipe's cache entries.")
def clean(recipe: str, overrides: tuple[str, ...], with_cache: bool) -> None:
    """Remove what builds of the recipe wrote to its output directory (and with --cache its cached artifacts).

    Only a directory marked by a trtbuild build is touched, and in it only the stage links, build.json
    and bench/ that builds write; files of your own there stay."""
    loaded = load(recipe, overrides)
    out = loaded.output_path
    removed, kept = 0, []
    if with_cache:
        store = artifact_cache()
        if store.root.exists():
            store.require_marked("clean")
        for entry in store.entries():
            recipe_info = (entry.manifest_or_none() or {}).get("recipe")
            # This recipe's entries: its name AND its file (another recipe of the same name elsewhere
            # keeps its entries; an entry another recipe reused stays recorded under that one).
            if not isinstance(recipe_info, dict) or recipe_info.get("name") != loaded.name:
                continue
            if recipe_info.get("file") != str(loaded.recipe_file):
                continue
            if store.remove(entry):
                removed += 1
            else:
                kept.append(f"{entry.stage}/{entry.key}")
    cleaned = clean_output_dir(out)
    what = f"removed {', '.join(cleaned)} from {out}" if cleaned else f"nothing built in {out}"
    in_use = f" (kept {len(kept)} a running server uses: {', '.join(kept)})" if kept else ""
    click.echo(what + (f"; {removed} cache entries{in_use}" if with_cache else ""))
