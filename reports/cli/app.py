"""The ``reports`` command: the operator's entry point. Reads the environment once, here."""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
import sqlalchemy.exc
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.errors import BadInput, ConfigurationError, DatabaseMissing, ReportsError
from reports.periods import Period, parse_closed
from reports.settings import Settings

#: Exit code for input the command rejected without changing anything.
EXIT_BAD_INPUT = 2

#: Longest text a filter option takes, in characters.
MAX_TEXT_OPTION = 200


class Obj:
    """What every command shares: the settings and, on first use, the database."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engine: sqlalchemy.Engine | None = None

    def sessions(self) -> sessionmaker[Session]:
        if self._engine is None:
            # No command but `db upgrade` (which migrates through its own engine) may create a
            # SQLite file: every other one needs the tables, and SQLite would create an empty
            # database at a mistyped path, or under ./var of whatever folder it is run from.
            self._engine = create_db_engine(self.settings.database_url, create=False)
        return session_factory(self._engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions().begin() as session:
            yield session


pass_obj = click.make_pass_decorator(Obj)


#: ``-h`` as well as ``--help``, on every command (subcommands inherit it from the group's context).
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


#: Each top-level command, and the module of this package that defines it. A command's module is
#: imported when the command is asked for, so `reports progress` loads what it needs and not the
#: web process, the exporter or the demo: about a sixth of the CPU a command spends starting.
COMMAND_MODULES: Mapping[str, str] = {
    "cancel": "admin",
    "periods": "admin",
    "send-now": "admin",
    "console": "console",
    "db": "database",
    "seed": "database",
    "demo": "demo",
    "dlq": "dlq",
    "exporter": "exporter",
    "feedback": "feedback",
    "trigger": "periods",
    "progress": "periods",
    "preview": "preview",
    "prune": "prune",
    "reconcile": "reconcile",
    "suppress": "suppress",
    "web": "web",
}


class Group(click.Group):
    """A group whose command list shows each command's whole summary, wrapped to the terminal,
    and whose commands are defined in the modules ``modules`` names, imported on first use.

    Click cuts a summary to what fits on one line after the command's name and ends it with
    "...": `reports -h` must say what every command does without sending you to each one's help.
    """

    #: Subgroups (`reports dlq`, `reports db`, `reports suppress`) list their commands the same way.
    group_class = type

    def __init__(self, *args: Any, modules: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modules = modules or {}

    def _define(self, name: str) -> None:
        if name not in self.commands and name in self.modules:
            importlib.import_module(f"{__package__}.{self.modules[name]}")

    def list_commands(self, ctx: click.Context) -> list[str]:
        for name in self.modules:
            self._define(name)
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._define(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, summary(command))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def summary(command: click.Command) -> str:
    """A command's short help, else the first paragraph of its help, whole (up to a ``\\f``)."""
    if command.short_help:
        return command.short_help
    text = inspect.cleandoc(command.help or "").partition("\f")[0]
    return " ".join(text.split("\n\n", 1)[0].split())


@click.group(cls=Group, context_settings=CONTEXT_SETTINGS, modules=COMMAND_MODULES)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Monthly reports: plan, send and watch one email per active user per month."""
    ctx.obj = Obj(Settings.from_env())


class FiniteFloatRange(click.FloatRange):
    """A float range that also rejects ``nan`` (which compares false with both bounds) and infinities."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: bytes that were not arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Reject text the database cannot take (bytes that are not UTF-8) or that no filter needs (too long)."""
    if value is None:
        return None
    if not is_utf8(value):
        raise click.BadParameter("is not valid UTF-8 text.")
    if len(value) > MAX_TEXT_OPTION:
        raise click.BadParameter(f"is longer than {MAX_TEXT_OPTION} characters.")
    return value


def echo_json_array(rows: Iterable[object]) -> int:
    """Print ``rows`` as one JSON array, the bytes ``json.dumps`` writes, a thousand at a time as
    they come: a list of a million is never held whole, as rows or as text. Returns how many."""
    printed, remaining = 0, iter(rows)
    click.echo("[", nl=False)
    while chunk := list(itertools.islice(remaining, 1000)):
        click.echo((", " if printed else "") + ", ".join(json.dumps(row) for row in chunk), nl=False)
        printed += len(chunk)
    click.echo("]")
    return printed


def echo_listing(rows: Iterable[Any], *, as_json: bool, line: Callable[[Any], str], counted: str) -> None:
    """Print a listing as it is read: one JSON array, or one ``line`` a row and then how many
    (``"3 dead letter(s)."`` for ``counted="dead letter(s)"``)."""
    if as_json:
        echo_json_array(rows)
        return
    printed = 0
    for row in rows:
        printed += 1
        click.echo(line(row))
    click.echo(f"{printed} {counted}.")


def iso_utc(moment: datetime | None) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with its ``Z``, to the second."""
    return moment.isoformat(timespec="seconds") + "Z" if moment else None


def non_empty(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Refuse an empty value, which would mean something other than what was typed: the current
    folder for a folder, every address for an address to listen on."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty.")
    return value


def period_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A ``--period`` filter: ``YYYY-MM`` checked, or unset."""
    return str(Period.parse(value)) if value is not None else None


def period_argument(closed: bool) -> Callable[[Any], Any]:
    def convert(_ctx: click.Context, _param: click.Parameter, value: str) -> Period:
        return parse_closed(value, utcnow()) if closed else Period.parse(value)

    return click.argument("period", callback=convert)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; rejected input is one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="reports", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        # A bare group (`reports`, `reports dlq`) asked for nothing wrong: its usage is the answer.
        click.echo(e.ctx.get_help())
    except (BadInput, ConfigurationError) as e:
        _fail(str(e), EXIT_BAD_INPUT)
    except click.UsageError as e:
        _fail(e.format_message(), EXIT_BAD_INPUT)
    except click.Abort:
        _fail("Aborted.", 130)
    except DatabaseMissing as e:
        # Like an unreachable database (exit 1), not bad input: the command line was fine.
        _fail(str(e), 1)
    except sqlalchemy.exc.DatabaseError as e:
        # Unreachable, not migrated, or (SQLite) a file that is no database. Its subclasses for
        # rows the code got wrong are bugs, and keep their traceback.
        if isinstance(e, _BUGS):
            raise
        # The driver's text can carry the URL; show only the error's kind.
        _fail(f"Database error ({type(e.orig).__name__}); is it reachable and migrated (`reports db upgrade`)?", 1)
    except ReportsError as e:
        # A condition the command names itself (the demo's workers exited, say): its message is the line.
        _fail(str(e), 1)
    except Exception as e:
        if not _is_broker_error(e):
            raise
        _fail(f"Broker error ({type(e).__name__}); is the broker (BROKER_URL) or Redis (REDIS_URL) reachable?", 1)


_BUGS = (
    sqlalchemy.exc.IntegrityError,
    sqlalchemy.exc.DataError,
    sqlalchemy.exc.InternalError,
    sqlalchemy.exc.NotSupportedError,
)

#: Each broker client's errors, by module and class: Redis's, Dramatiq's (RabbitMQ's connection
#: through pika), botocore's (SQS).
_BROKER_ERRORS = (
    ("redis", "RedisError"),
    ("dramatiq.errors", "BrokerConnectionError"),
    ("botocore.exceptions", "BotoCoreError"),
    ("botocore.exceptions", "ClientError"),
)


def _is_broker_error(error: Exception) -> bool:
    # Looked up, not imported: only a command that imported a broker's client can raise its errors,
    # and those that never touch the broker (suppress, db, feedback, admin, console) start without them.
    for module, name in _BROKER_ERRORS:
        errors = getattr(sys.modules.get(module), name, None)
        if isinstance(errors, type) and isinstance(error, errors):
            return True
    return False


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
