"""The web process's uvicorn server: it cuts off a client whose request head is late, answers 503
beyond a number of connections, and adds :data:`SECURITY_HEADERS` to every answer, its own errors
included."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any, ClassVar

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from reports.settings import Settings, trusted_proxies

logger = logging.getLogger(__name__)

#: Sent with every answer. A URL's token is a credential: no referrer carries it elsewhere, no
#: cache or search engine keeps the page, and no answer is read as another type than it says.
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Robots-Tag", "noindex, nofollow"),
    ("X-Content-Type-Options", "nosniff"),
)

#: Seconds a stopping server gives requests in flight, well inside a platform's 30 s grace period.
GRACEFUL_SHUTDOWN_SECONDS = 10


def build(app: ASGIApp, settings: Settings) -> uvicorn.Server:
    """The server for ``app``, bounded by the WEB_* settings, logging ``reports.*`` with its own lines."""
    proxies = trusted_proxies(settings.forwarded_allow_ips)
    config = uvicorn.Config(
        app,
        http=_head_bounded(settings.web_read_timeout_seconds),
        # No route is a WebSocket, and the head deadline takes every connection to stay HTTP.
        ws="none",
        # uvicorn refuses a request once this many connections are open, the request's own among them.
        limit_concurrency=settings.web_max_connections + 1,
        headers=list(SECURITY_HEADERS),
        server_header=False,
        log_config=_log_config(settings.log_level),
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # Off: the access log would write every user's token (a credential) into the logs.
        access_log=False,
        # The client's address as the trusted proxies tell it, for the console's login limit.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies,
    )
    return uvicorn.Server(config)


def _log_config(level: str) -> dict[str, Any]:
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["reports"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


def _head_bounded(timeout_seconds: float) -> type[H11Protocol]:
    class HeadBoundedProtocol(_HeadBoundedProtocol):
        head_timeout_seconds = timeout_seconds

    return HeadBoundedProtocol


class _HeadBoundedProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request head has not fully arrived
    ``head_timeout_seconds`` after the connection opened or after its last answer.

    uvicorn's own keep-alive timer stops at the first byte of a head, and no timer runs before the
    first request: a client sending nothing, or a byte now and then, held its connection for ever.
    """

    head_timeout_seconds: ClassVar[float]
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        # Before uvicorn goes on to a request already received (pipelined), which then counts as arrived.
        self._await_head()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # uvicorn writes this answer (to bytes h11 cannot parse) without the server's default headers.
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=msg.encode("ascii")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_seconds, self._close_unless_begun, self.cycle)

    def _close_unless_begun(self, previous: RequestResponseCycle | None) -> None:
        if self.cycle is not previous or self.transport.is_closing():
            return  # a new request's head arrived in time
        if self.conn.trailing_data[0]:
            logger.info("Closed a connection whose request head did not arrive within %g s.", self.head_timeout_seconds)
        self.transport.close()
