"""The `trtbuild` command line: every command (one module each) on the group, and `main`.
Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import click

# Each command module registers its command on the group when imported.
import trtbuild.cli.bench  # noqa: F401
import trtbuild.cli.build  # noqa: F401
import trtbuild.cli.cache  # noqa: F401
import trtbuild.cli.clean  # noqa: F401
import trtbuild.cli.demo  # noqa: F401
import trtbuild.cli.plan  # noqa: F401
import trtbuild.cli.schema  # noqa: F401
import trtbuild.cli.serve  # noqa: F401
import trtbuild.cli.validate  # noqa: F401
from trtbuild.cli.common import cli
from trtbuild.core.errors import TrtbuildError, UserError, os_error


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="trtbuild", standalone_mode=False)
    except TrtbuildError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # outside a stage (output dir, cache upkeep): still one line
        click.echo(f"error: {os_error(exc).one_line()}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()} (see `trtbuild --help`)", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("error: interrupted; nothing half-written was kept", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()


__all__ = ["cli", "main", "UserError"]
