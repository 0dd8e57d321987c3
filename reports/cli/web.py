"""``reports web``: the unsubscribe pages, the provider webhooks, the console and the health check,
served by uvicorn. Stops on SIGTERM."""

from __future__ import annotations

import signal
import socket

import click

from reports import tokens
from reports.cli.app import Obj, cli, non_empty, pass_obj
from reports.endpoints import is_loopback
from reports.errors import BadInput


@cli.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    callback=non_empty,
    help="Address to listen on (0.0.0.0 on a PaaS).",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@pass_obj
def web(obj: Obj, host: str, port: int) -> None:
    """Serve the one-click unsubscribe endpoint, its pages, the provider webhooks, the console, and /healthz."""
    # Imported here: only the web process needs the web stack.
    from reports.console import site as console_app
    from reports.feedback import web as feedback_web
    from reports.unsubscribe.web import HEALTH_PATH, build_app
    from reports.web import guards, server

    settings = obj.settings
    if not settings.unsubscribe_secret and not is_loopback(host):
        # The built-in secret is in the source: anyone who reaches this address could sign a link
        # that unsubscribes any user.
        raise BadInput(
            f"UNSUBSCRIBE_SECRET is unset and reports web would listen on {host}, beyond this machine: "
            "set UNSUBSCRIBE_SECRET (and PUBLIC_BASE_URL), or listen on 127.0.0.1."
        )
    sessions = obj.sessions()
    hooks = feedback_web.routes(settings, sessions)
    console = console_app.routes(settings, sessions)
    app = guards.guard(
        build_app(
            sessions,
            tokens.links(settings).signer,
            product_name=settings.report_product_name,
            default_locale=settings.report_locale,
            mounted=[*hooks, *console],
        ),
        public_base_url=settings.public_base_url,
        read_timeout_seconds=settings.web_read_timeout_seconds,
        any_host_paths=(HEALTH_PATH,),
    )
    try:
        # Bound here, not by uvicorn: a port in use or an unknown host is one line and exit 2.
        listener = socket.create_server((host, port), family=_family(host))
    except OSError as e:
        raise BadInput(f"Cannot listen on {host}:{port}: {e.strerror or e}.") from None
    if not settings.unsubscribe_secret:
        click.echo(
            "note: UNSUBSCRIBE_SECRET is unset; links are signed with the built-in development secret "
            "(allowed only while PUBLIC_BASE_URL and the address listened on are this machine's).",
            err=True,
        )
    click.echo(f"Serving unsubscribe pages on http://{host}:{port} for {settings.public_base_url}", err=True)
    click.echo(f"Provider webhooks: {', '.join(feedback_web.served(hooks)) or 'none configured'}", err=True)
    click.echo(
        f"Console: {settings.public_base_url}{console_app.PREFIX}/"
        if console
        else "Console: off (CONSOLE_USERS is unset)",
        err=True,
    )
    if settings.sns_test_ca_file is not None:
        click.echo("note: SNS_TEST_CA_FILE is set: SNS is trusted through a test CA (tests only).", err=True)
    # uvicorn drains on SIGTERM and SIGINT, then raises the signal again under the handler it
    # found: this no-op one makes a drained stop exit 0, as the other processes do (Python's own
    # for SIGINT would raise KeyboardInterrupt after the drain, read as "Aborted").
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda _signum, _frame: None)
    server.build(app, settings).run(sockets=[listener])


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
