"""The ``reports`` command. Each module adds one group of subcommands to :data:`app.cli`."""

from reports.cli import (  # noqa: F401  (registers the commands)
    admin,
    console,
    database,
    demo,
    dlq,
    exporter,
    feedback,
    periods,
    preview,
    prune,
    reconcile,
    suppress,
    web,
)
from reports.cli.app import cli, main

__all__ = ["cli", "main"]
