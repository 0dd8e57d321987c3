"""The ``reports`` command. Each module adds one group of subcommands to :data:`app.cli`."""

from reports.cli import admin, database, demo, dlq, exporter, periods, reconcile  # noqa: F401  (registers the commands)
from reports.cli.app import cli, main

__all__ = ["cli", "main"]
