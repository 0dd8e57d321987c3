"""What the web process asks of every request, whatever its route: a Host that is PUBLIC_BASE_URL's
(else 400; the health check excepted), a body of at most :data:`MAX_BODY_BYTES` counted as it
arrives (else 413), all of it within the read timeout (else 408); and a client that leaves is one
log line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reports.endpoints import is_loopback

logger = logging.getLogger(__name__)

#: Largest request body read, in bytes: the one-click body is 26. A route that takes more (a
#: provider's webhook) raises it with Starlette's ``RequestBodyLimitMiddleware`` on that route.
MAX_BODY_BYTES = 4096

#: The names a loopback PUBLIC_BASE_URL is reached by on its own machine (the demo, tests).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def guard(app: ASGIApp, *, public_base_url: str, read_timeout_seconds: float, any_host_paths: Sequence[str]) -> ASGIApp:
    """``app`` behind the checks above; ``any_host_paths`` are answered whatever the Host."""
    bounded = RequestBodyLimitMiddleware(_BodyReading(app, read_timeout_seconds), max_body_size=MAX_BODY_BYTES)
    return _HostCheck(bounded, allowed_hosts=accepted_hosts(public_base_url), any_host_paths=any_host_paths)


def accepted_hosts(public_base_url: str) -> list[str]:
    """The Host header values (without a port) a request to ``public_base_url`` may carry."""
    host = (urlsplit(public_base_url).hostname or "").lower()
    # The Host header writes an IPv6 address in brackets, as the URL does.
    own = f"[{host}]" if ":" in host else host
    return list(dict.fromkeys([own, *LOOPBACK_HOSTS])) if is_loopback(host) else [own]


class _HostCheck:
    def __init__(self, app: ASGIApp, *, allowed_hosts: list[str], any_host_paths: Sequence[str]) -> None:
        self.app = app
        # No www redirect: a redirect is what the check is there to keep from pointing elsewhere.
        self.checked = TrustedHostMiddleware(app, allowed_hosts=allowed_hosts, www_redirect=False)
        self.any_host_paths = frozenset(any_host_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        unchecked = scope["type"] == "http" and scope["path"] in self.any_host_paths
        await (self.app if unchecked else self.checked)(scope, receive, send)


class _BodyReading:
    """Bounds the time a request's body may take, and turns a client that left into one log line."""

    def __init__(self, app: ASGIApp, timeout_seconds: float) -> None:
        self.app = app
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The whole body counts, not each read: a client trickling a byte at a time is cut off too.
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        complete = False

        async def bounded() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                logger.info("Answered 408: a request body did not arrive within %g s.", self.timeout_seconds)
                # Raised where the route reads, so that Starlette answers it as it does the 413;
                # "close", because the rest of the body may still come.
                raise HTTPException(408, headers={"Connection": "close"}) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        try:
            await self.app(scope, bounded, send)
        except ClientDisconnect:
            # Not an error of the app's: the connection is gone, and there is nobody to answer.
            logger.info("A client left before its request body arrived.")
