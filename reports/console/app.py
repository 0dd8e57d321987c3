"""The console's ASGI application, mounted at ``/console`` by the web process: logins, sessions,
CSRF, roles and the headers every console answer carries. The pages are in :mod:`views`, the
actions in :mod:`actions`.

* Sessions are Starlette's signed cookies (itsdangerous): ``HttpOnly``, ``SameSite=Strict``,
  ``Secure`` unless PUBLIC_BASE_URL is loopback, scoped to ``/console``. A session ends
  CONSOLE_SESSION_SECONDS after its login, whatever is done with it, and when its user leaves
  CONSOLE_USERS or is given a new password there (the role is read from CONSOLE_USERS at each
  request, never from the cookie).
* Every POST carries the session's CSRF token; a missing or wrong one is answered 403.
* A ``viewer`` reads every page; its POSTs are answered 403 and change nothing.
* Logins are throttled per user name and per address (:mod:`throttle`), fleet-wide.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import jinja2
import redis
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reports import console_settings
from reports.clock import utcnow
from reports.console import audit, passwords
from reports.console.pace import Sampler
from reports.console.throttle import LoginThrottle
from reports.console_settings import ConsoleUser, Role
from reports.endpoints import is_loopback
from reports.ops.metrics import fleet_collector
from reports.queue import Queue
from reports.settings import Settings, trusted_proxies
from reports.worker.broker import Broker, build_broker
from reports.worker.queues import queue_for

logger = logging.getLogger(__name__)

#: Where the console is served.
PREFIX = "/console"

#: Passwords checked at once. Argon2 takes 64 MiB a check by design: twenty logins at once, from
#: anyone who can reach the login form, would take the web process past a gigabyte.
PASSWORD_CHECKS_AT_ONCE = 2
#: How long a login waits for its turn before it is answered 503, in seconds.
PASSWORD_CHECK_WAIT_SECONDS = 10.0

#: Sent with every console answer: nothing loads from elsewhere, no inline script or style runs,
#: forms post only here, frames show only the console's own preview, and nobody frames the console.
CONSOLE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

#: The session cookie's name.
COOKIE = "console_session"

#: Longest user name read from the login form, in characters (CONSOLE_USERS allows 64).
MAX_NAME_CHARS = 64

#: Longest password read from the login form, in characters.
MAX_PASSWORD_CHARS = 1024

_HERE = Path(__file__).resolve().parent

#: A page handler: the request, the user, and the console; returns the answer.
Page = Callable[[Request, ConsoleUser, "Console"], Response]
#: An action handler: as a page, plus the posted form's fields.
Action = Callable[[Request, ConsoleUser, "Console", dict[str, str]], Response]


@dataclass
class Console:
    """What the console's handlers share; the broker is built at the first action that needs one."""

    settings: Settings
    sessions: sessionmaker[Session]
    users: dict[str, ConsoleUser]
    throttle: LoginThrottle
    templates: jinja2.Environment
    #: Unix time, in seconds.
    clock: Callable[[], float] = time.time
    sampler: Sampler = field(default_factory=Sampler)
    _broker: Broker | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _password_turns: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def __post_init__(self) -> None:
        self.fleet = fleet_collector(self.settings, self.sessions)
        self.decoy = passwords.decoy(self.users.values())
        self.trusts_every_proxy = trusted_proxies(self.settings.forwarded_allow_ips) == ["*"]

    def password_turns(self) -> asyncio.Semaphore:
        """The turns to check a password, :data:`PASSWORD_CHECKS_AT_ONCE` at a time: made in the
        running event loop, which an asyncio semaphore belongs to once a login has waited on it
        (uvicorn runs one loop; a test client may start one per request)."""
        loop = asyncio.get_running_loop()
        if self._password_turns is None or self._password_turns[0] is not loop:
            self._password_turns = (loop, asyncio.Semaphore(PASSWORD_CHECKS_AT_ONCE))
        return self._password_turns[1]

    @property
    def broker(self) -> Broker:
        with self._lock:
            if self._broker is None:
                self._broker = build_broker(self.settings)
            return self._broker

    @property
    def queue(self) -> Queue:
        """The queue port on :attr:`broker`, as the commands use it."""
        return queue_for(self.broker)

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        user = _signed_in(request, self)
        flash = request.session.pop("flash", None)
        context.setdefault("error", None)
        html = self.templates.get_template(template).render(
            user=user,
            csrf=csrf_token(request),
            flash=flash,
            prefix=PREFIX,
            product=self.settings.report_product_name,
            **context,
        )
        return HTMLResponse(html, status_code=status)


#: What adds a part of the console (its pages, its actions) to the application.
Part = Callable[["Console"], list[BaseRoute]]


def routes(
    settings: Settings,
    sessions: sessionmaker[Session],
    *,
    parts: Sequence[Part],
    redis_client: redis.Redis | None = None,
    clock: Callable[[], float] = time.time,
) -> list[BaseRoute]:
    """``Mount("/console", …)`` with ``parts``; none while CONSOLE_USERS is unset (the console
    then answers 404)."""
    users = console_settings.users(settings)
    if not users:
        return []
    client = redis_client or redis.Redis.from_url(settings.shared_redis_url)
    console = Console(
        settings=settings,
        sessions=sessions,
        users=users,
        throttle=LoginThrottle(client, settings.broker_namespace),
        templates=_templates(),
        clock=clock,
    )
    app = Starlette(
        routes=[
            Route("/", _home(console), methods=["GET"]),
            Route("/login", _login_page(console), methods=["GET"]),
            Route("/login", _login(console), methods=["POST"]),
            Route("/logout", _logout, methods=["POST"]),
            *(route for part in parts for route in part(console)),
            Mount("/static", app=StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=[
            Middleware(_Headers),
            Middleware(
                SessionMiddleware,
                secret_key=_session_key(settings, client),
                session_cookie=COOKIE,
                max_age=int(settings.console_session_seconds),
                path=PREFIX,
                same_site="strict",
                https_only=not is_loopback(urlsplit(settings.public_base_url).hostname or ""),
            ),
        ],
    )
    app.router.redirect_slashes = False
    return [Mount(PREFIX, app=app)]


def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _session_key(settings: Settings, client: redis.Redis) -> str:
    """CONSOLE_SECRET, else one random key for every web process, made by the first that starts."""
    if settings.console_secret:
        return settings.console_secret
    key = f"{settings.broker_namespace}:console:session_key"
    client.set(key, secrets.token_urlsafe(32), nx=True)
    return cast(bytes, client.get(key)).decode()


# --- who is signed in -------------------------------------------------------------------------


def _signed_in(request: Request, console: Console) -> ConsoleUser | None:
    """The session's user while the session is younger than CONSOLE_SESSION_SECONDS and the user is
    still in CONSOLE_USERS; an expired session is cleared (and noted for the login page)."""
    name, since = request.session.get("user"), request.session.get("since")
    if not isinstance(name, str) or not isinstance(since, int | float):
        return None
    user = console.users.get(name)
    if (
        user is None
        or request.session.get("password") != _password_mark(user)
        or console.clock() - since >= console.settings.console_session_seconds
    ):
        request.session.clear()
        request.session["flash"] = "Your session expired; log in again."
        return None
    return user


def _password_mark(user: ConsoleUser) -> str:
    """A mark of the user's password hash as CONSOLE_USERS holds it now, kept in the session: a new
    password ends the sessions logged in with the old one. A digest: the cookie is signed, not secret."""
    return hashlib.sha256(user.password_hash.encode()).hexdigest()[:16]


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return token


def _csrf_ok(request: Request, form: dict[str, str]) -> bool:
    expected = request.session.get("csrf")
    sent = form.get("csrf", "")
    return isinstance(expected, str) and hmac.compare_digest(expected.encode(), sent.encode())


def viewing(console: Console, page: Page) -> Callable[[Request], Awaitable[Response]]:
    """``page`` for any signed-in user; anyone else is sent to the login page."""

    async def endpoint(request: Request) -> Response:
        user = _signed_in(request, console)
        if user is None:
            return _to_login()
        return await run_in_threadpool(page, request, user, console)

    return endpoint


def acting(console: Console, action: Action) -> Callable[[Request], Awaitable[Response]]:
    """``action`` for a signed-in admin whose form carries the session's CSRF token; 403 otherwise."""

    async def endpoint(request: Request) -> Response:
        user = _signed_in(request, console)
        form = await _form(request)
        if user is None:
            return _refused("Log in first.")
        refusal = None
        if not _csrf_ok(request, form):
            logger.warning("Console: refused a POST without a valid CSRF token.", extra={"console_user": user.name})
            refusal = "The form is stale or forged: reload the page and try again."
        elif user.role != Role.ADMIN:
            logger.warning("Console: refused a viewer's action.", extra={"console_user": user.name})
            refusal = "Viewers can look but not act."
        if refusal is not None:
            await run_in_threadpool(
                _audit_refusal, console, actor=user.name, action="post", target=request.url.path, reason=refusal
            )
            return _refused(refusal)
        return await run_in_threadpool(action, request, user, console, form)

    return endpoint


async def _form(request: Request) -> dict[str, str]:
    async with request.form(max_files=0, max_fields=32) as form:
        return {key: value for key, value in form.items() if isinstance(value, str)}


def _refused(message: str) -> Response:
    return PlainTextResponse(message, status_code=403)


def _to_login() -> Response:
    return RedirectResponse(f"{PREFIX}/login", status_code=303)


def back(request: Request, path: str, message: str) -> Response:
    """Post/redirect/get: ``message`` shown once on the page at ``path`` (under the console)."""
    request.session["flash"] = message
    return RedirectResponse(f"{PREFIX}{path}", status_code=303)


# --- login and logout -------------------------------------------------------------------------


def _home(console: Console) -> Callable[[Request], Awaitable[Response]]:
    async def home(request: Request) -> Response:
        if _signed_in(request, console) is None:
            return _to_login()
        return RedirectResponse(f"{PREFIX}/periods", status_code=303)

    return home


def _login_page(console: Console) -> Callable[[Request], Awaitable[Response]]:
    async def page(request: Request) -> Response:
        if _signed_in(request, console) is None:
            # A fresh token each time the form is shown: the pre-login cookie that carries it lasts
            # CONSOLE_SESSION_SECONDS from here, not from a first visit long ago.
            request.session["csrf"] = secrets.token_urlsafe(32)
        return console.render(request, "login.html")

    return page


def _login(console: Console) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        form = await _form(request)
        if not _csrf_ok(request, form):
            return _refused("The form is stale or forged: reload the page and try again.")
        name = form.get("name", "")[:MAX_NAME_CHARS]
        password = form.get("password", "")[:MAX_PASSWORD_CHARS]
        address = _login_address(request, console.trusts_every_proxy)
        if await run_in_threadpool(console.throttle.attempt, name, address):
            logger.warning("Console: refused a login past the throttle.")
            return console.render(request, "login.html", status=429, error="Too many failed logins; try later.")
        user = console.users.get(name)
        turns = console.password_turns()
        try:
            async with asyncio.timeout(PASSWORD_CHECK_WAIT_SECONDS):
                await turns.acquire()
        except TimeoutError:
            logger.warning("Console: refused a login, too many at once.")
            return console.render(request, "login.html", status=503, error="Too many logins at once; try again.")
        try:
            verified = await run_in_threadpool(lambda: passwords.verify(user, password, decoy=console.decoy))
        finally:
            turns.release()
        if not verified or user is None:
            logger.warning("Console: a login failed.")
            # Up to the throttle's limit, a refused login is recorded with the name it tried and
            # where from; past it, only logged, so that a flood cannot fill the table.
            await run_in_threadpool(
                _audit_refusal,
                console,
                # Whatever was typed, made printable: a NUL is refused by PostgreSQL's text.
                actor="".join(c if c.isprintable() else "?" for c in name) or "(no name)",
                action="login",
                target=f"from {address}",
                reason="Wrong name or password.",
            )
            return console.render(request, "login.html", status=401, error="Wrong name or password.")
        await run_in_threadpool(console.throttle.succeeded, name, address)
        # A new session, with a new CSRF token: nothing from before the login carries over.
        request.session.clear()
        request.session.update(
            user=user.name, since=console.clock(), password=_password_mark(user), csrf=secrets.token_urlsafe(32)
        )
        await run_in_threadpool(_audit_login, console, user)
        return RedirectResponse(f"{PREFIX}/periods", status_code=303)

    return login


def _login_address(request: Request, trusts_every_proxy: bool) -> str:
    """The address the login limit counts.

    Trusting every proxy (``FORWARDED_ALLOW_IPS=*``), the server takes the client's address from the
    leftmost ``X-Forwarded-For`` entry, which the client may write itself: one client would pass for
    as many as it likes, or for another it wants locked out. The rightmost entry is the one the
    platform's router added, the address it took the request from.
    """
    forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
    if trusts_every_proxy and (nearest := forwarded.rsplit(",", 1)[-1].strip()):
        return nearest
    return request.client.host if request.client else "unknown"


def _audit_refusal(console: Console, *, actor: str, action: str, target: str, reason: str) -> None:
    with console.sessions.begin() as session:
        audit.record(session, actor=actor, action=action, target=target, outcome=f"refused: {reason}", now=utcnow())


def _audit_login(console: Console, user: ConsoleUser) -> None:
    with console.sessions.begin() as session:
        audit.record(session, actor=user.name, action="login", target=user.role.value, outcome="ok", now=utcnow())


async def _logout(request: Request) -> Response:
    form = await _form(request)
    if not _csrf_ok(request, form):
        # Said, not passed over: a tab whose token went stale (a login in another tab since) would
        # otherwise show the login form while its session goes on.
        return _refused("The form is stale: reload the page and log out again.")
    request.session.clear()
    return _to_login()


class _Headers:
    """Adds :data:`CONSOLE_POLICY` to every console answer (the server adds no-store and the rest)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", CONSOLE_POLICY)
                headers.setdefault("X-Frame-Options", "DENY")
            await send(message)

        await self.app(scope, receive, send_with_policy)
