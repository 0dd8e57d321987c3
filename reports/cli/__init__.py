"""The ``reports`` command. Each module adds one group of subcommands to :data:`app.cli`, when
the command is first asked for (:data:`app.COMMAND_MODULES`)."""

from reports.cli.app import cli, main

__all__ = ["cli", "main"]
