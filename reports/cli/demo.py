"""``reports demo``: the main job on the embedded default."""

from __future__ import annotations

import click
from rich.console import Console

from reports.cli.app import Obj, cli, pass_obj
from reports.ops.demo import DEFAULT_USERS, run_demo


@cli.command()
@click.option(
    "--users",
    type=click.IntRange(min=1),
    default=None,
    help=f"Users to seed on the first run (default {DEFAULT_USERS:,}); a later run reuses them.",
)
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--fresh", is_flag=True, help="Delete the previous demo's data under VAR_DIR and start over.")
@click.option(
    "--serve", is_flag=True, help="Keep the embedded Redis and the workers running after the run, until Ctrl-C."
)
@pass_obj
def demo(obj: Obj, users: int | None, processes: int, threads: int, fresh: bool, serve: bool) -> None:
    """Run last month's reports end to end on the embedded default (SQLite, embedded Redis, Maildir)."""
    run_demo(
        obj.settings,
        users=users,
        processes=processes,
        threads=threads,
        fresh=fresh,
        serve=serve,
        console=Console(),
    )
