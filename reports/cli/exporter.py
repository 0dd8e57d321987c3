"""``reports exporter``: serve Prometheus metrics read from Redis and the database."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click
from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from reports import logs
from reports.cli.app import Obj, cli, pass_obj
from reports.errors import BadInput
from reports.ops.metrics import fleet_collector


@cli.command()
@click.option("--host", help="Address to listen on.  [default: EXPORTER_HOST, 0.0.0.0]")
@click.option("--port", type=click.IntRange(1, 65535), default=9300, show_default=True)
@pass_obj
def exporter(obj: Obj, host: str | None, port: int) -> None:
    """Serve /metrics for Prometheus: queues, dead letters, the breaker, periods. Stops on SIGTERM."""
    settings = obj.settings
    logs.configure(settings.log_level)
    host = host or settings.exporter_host
    registry = CollectorRegistry()
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        # An unknown host name or a port already taken: the operator's input, not a crash.
        raise BadInput(f"Cannot listen on {host}:{port}: {e.strerror or e}.") from None
    # After the bind, so that bad input is named as such before a missing database is; the
    # registry is read only when scraped.
    registry.register(fleet_collector(settings, obj.sessions()))
    click.echo(f"Serving metrics on http://{host}:{port}/metrics", err=True)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
