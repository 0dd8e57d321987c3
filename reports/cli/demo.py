"""``reports demo``: the main job on the embedded default."""

from __future__ import annotations

import click
from rich.console import Console

from reports.cli.app import Obj, cli, pass_obj
from reports.demo import run_demo


@cli.command()
@click.option("--users", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Users to seed on the first run.")
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True)
@pass_obj
def demo(obj: Obj, users: int, processes: int, threads: int) -> None:
    """Run last month's reports end to end on the embedded default (SQLite, embedded Redis, Maildir)."""
    run_demo(obj.settings, users=users, processes=processes, threads=threads, console=Console())
