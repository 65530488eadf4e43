"""`trtbuild cache ls` / `trtbuild cache gc`."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from trtbuild.cli.common import artifact_cache, cli, print_json
from trtbuild.core.cache import VERIFIED, Entry, dir_size
from trtbuild.core.errors import UserError


@cli.group()
def cache() -> None:
    """Inspect or prune the artifact cache (TRTBUILD_CACHE or ~/.cache/trtbuild)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True)
def cache_ls(as_json: bool) -> None:
    """List cached artifacts, interrupted draft trainings (resume) and entries with a broken manifest."""
    store = artifact_cache()
    rows: list[dict[str, Any]] = []
    broken: list[str] = []
    for entry in store.entries():
        manifest = entry.manifest_or_none()
        if manifest is None:
            broken.append(str(entry.path))
            continue
        recipe = manifest.get("recipe")
        rows.append({"stage": entry.stage, "key": entry.key,
                     "recipe": recipe.get("name") if isinstance(recipe, dict) else None,
                     "created": manifest.get("created"), "bytes": dir_size(entry.path), "path": str(entry.path)})
    for path in store.resume_dirs():
        rows.append({"stage": "resume", "key": path.name, "recipe": None,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store.resume_last_used(path))),
                     "bytes": dir_size(path), "path": str(path)})
    if as_json:
        print_json({"root": str(store.root), "entries": rows, "broken": broken,
                     "incomplete": [str(p) for p in store.incomplete()]})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cache: {store.root}")
    for column in ("stage", "key", "recipe", "created", "MB"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["stage"], row["key"][:12], str(row["recipe"]), str(row["created"]),
                      f"{row['bytes'] / 1e6:.1f}")
    Console().print(table)
    for name in broken:
        click.echo(f"broken manifest (skipped; `cache gc` removes it): {name}")


def _days(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (value >= 0 and value != float("inf")):
        raise click.BadParameter(f"{value} is not a number of days >= 0", ctx=ctx, param=param)
    return value


@cache.command("verify")
@click.argument("entries", nargs=-1, metavar="[STAGE/KEY]...")
def cache_verify(entries: tuple[str, ...]) -> None:
    """Hash every file of the named entries (default: the whole cache) against its manifest, whatever
    its size and times say; a damaged entry is reported and its check record dropped, so the next
    build that uses it rebuilds it. Exit 1 when any entry is damaged."""
    store = artifact_cache()
    found = {f"{e.stage}/{e.key}": e for e in store.entries()}
    for name in entries:
        if name not in found:
            raise UserError(f"no cache entry {name!r} in {store.root}",
                            fix="name one as `cache ls` shows it (STAGE/KEY), or give none to verify all")
    damaged = 0
    for name in entries or tuple(found):
        entry = found[name]
        problem = store.damage(entry, full=True, record=True)  # intact: later uses start from this check
        if problem is None:
            click.echo(f"ok {name}")
            continue
        damaged += 1
        with contextlib.suppress(OSError):
            (entry.path / VERIFIED).unlink()
        click.echo(f"damaged {name}: {problem} (the next build that uses it rebuilds it)")
    click.echo(f"{len(entries or found) - damaged} intact, {damaged} damaged")
    if damaged:
        sys.exit(1)


@cache.command("gc")
@click.option("--older-than", "days", type=float, default=30.0, show_default=True, callback=_days,
              help="Remove entries and interrupted draft trainings not used for this many days (>= 0).")
@click.option("--dry-run", is_flag=True)
def cache_gc(days: float, dry_run: bool) -> None:
    """Remove leftovers of killed builds, entries with a broken manifest, and what was unused for
    --older-than days (cache entries and the resume dirs of interrupted draft trainings)."""
    store = artifact_cache()
    if not store.root.exists():
        click.echo(f"no cache at {store.root}: nothing to remove")
        return
    store.require_marked("collect")  # a directory that is not a trtbuild cache: one line, exit 2
    cutoff = time.time() - days * 86400
    verb = "would remove" if dry_run else "removed"
    doomed: list[Entry] = []
    broken: list[Entry] = []
    leased: list[Entry] = []
    for entry in store.entries():
        if entry.manifest_or_none() is not None and store.last_used(entry) >= cutoff:
            continue
        if store.in_use(entry):
            leased.append(entry)
            continue
        (broken if entry.manifest_or_none() is None else doomed).append(entry)
    resumes = [p for p in store.resume_dirs() if store.resume_last_used(p) < cutoff and not store.resume_busy(p)]
    leftovers = store.incomplete()
    failed: list[str] = []  # what could not be removed (a read-only cache): said, never counted as removed

    def attempt(what: str, action: Callable[[], object]) -> bool:
        if dry_run:
            return True
        try:
            action()
        except OSError as exc:
            failed.append(what)
            click.echo(f"could not remove {what}: {exc.strerror or exc}")
            return False
        return True

    removed: list[Entry] = []
    for entry in doomed + broken:
        name = f"{entry.stage}/{entry.key}"
        try:
            if not dry_run and not store.remove(entry):  # leased since the check above
                leased.append(entry)
                continue
        except OSError as exc:
            failed.append(name)
            click.echo(f"could not remove {name}: {exc.strerror or exc}")
            continue
        removed.append(entry)
        click.echo(f"{verb} {name}" + (" (broken manifest)" if entry in broken else ""))
    for entry in leased:
        click.echo(f"kept {entry.stage}/{entry.key}: a running server uses it")
    resumes = [p for p in resumes if attempt(f"resume/{p.name}", functools.partial(store.remove_resume, p))]
    for path in resumes:
        click.echo(f"{verb} resume/{path.name}")
    leftovers = [p for p in leftovers if attempt(f"incomplete {p.parent.name}/{p.name}",
                                                 functools.partial(store.remove_incomplete, p))]
    for path in leftovers:
        click.echo(f"{verb} incomplete {path.parent.name}/{path.name}")
    click.echo(f"{sum(e in doomed for e in removed)} entries, {sum(e in broken for e in removed)} broken, "
               f"{len(resumes)} resume dirs, {len(leftovers)} incomplete" + (f", {len(leased)} in use kept"
                                                                            if leased else "")
               + (f", {len(failed)} could not be removed" if failed else ""))
    if failed:
        raise UserError(f"{len(failed)} of what `cache gc` would remove in {store.root} could not be removed "
                        f"(first: {failed[0]})", fix="make the cache writable for this user, then run it again")
