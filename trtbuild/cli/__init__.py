"""The `trtbuild` command: one thin module per command (see main.py for the group)."""

from trtbuild.cli.root import cli, main

__all__ = ["cli", "main"]
