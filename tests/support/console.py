"""The console's users for tests, and a client that logs in the way a browser does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from argon2 import PasswordHasher
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from reports import tokens
from reports.console import site as console_app
from reports.settings import Settings
from reports.unsubscribe.web import build_app
from reports.web import guards

ADMIN_PASSWORD = "admin password 0123"
VIEWER_PASSWORD = "viewer password 4567"

#: Hashed once per test run, at Argon2's lowest cost (a verify reads its cost from the hash): the
#: production cost is slow on purpose (tests/unit/test_console_cli.py checks that one).
_CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
_HASHES = {"admin": _CHEAP.hash(ADMIN_PASSWORD), "viewer": _CHEAP.hash(VIEWER_PASSWORD)}

#: CONSOLE_USERS with one admin (``ada``) and one viewer (``vic``).
CONSOLE_USERS = f"ada:admin:{_HASHES['admin']},vic:viewer:{_HASHES['viewer']}"
#: CONSOLE_USERS after ``ada`` was taken out.
VIEWER_ONLY = f"vic:viewer:{_HASHES['viewer']}"
#: CONSOLE_USERS after ``ada`` was given a new password.
ADMIN_WITH_A_NEW_PASSWORD = f"ada:admin:{_CHEAP.hash('new admin password 89')},{VIEWER_ONLY}"

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def console_settings(settings: Settings, **overrides: object) -> Settings:
    values: dict[str, object] = {"console_users": CONSOLE_USERS, "public_base_url": "http://127.0.0.1:8000"}
    return replace(settings, **{**values, **overrides})  # type: ignore[arg-type]


@dataclass
class Clock:
    """Unix time that a test moves by hand."""

    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ConsoleClient:
    """The web process's app (guards and all) with the console mounted, in-process."""

    http: TestClient
    clock: Clock = field(default_factory=Clock)

    def csrf(self, path: str = "/console/login") -> str:
        page = self.http.get(path)
        match = _CSRF.search(page.text)
        assert match, page.text
        return match[1]

    def login(self, name: str = "ada", password: str = ADMIN_PASSWORD) -> int:
        csrf = self.csrf()
        answer = self.http.post("/console/login", data={"name": name, "password": password, "csrf": csrf})
        return answer.status_code

    def post(self, path: str, data: dict[str, str] | None = None, *, csrf: str | None = None) -> tuple[int, str]:
        token = csrf if csrf is not None else self.csrf("/console/periods")
        answer = self.http.post(path, data={**(data or {}), "csrf": token})
        return answer.status_code, answer.text


def client(settings: Settings, sessions: sessionmaker[Session], clock: Clock | None = None) -> ConsoleClient:
    clock = clock or Clock()
    mounted = console_app.routes(settings, sessions, clock=clock)
    app = guards.guard(
        build_app(sessions, tokens.links(settings).signer, product_name="Monthly Reports", mounted=mounted),
        public_base_url=settings.public_base_url,
        read_timeout_seconds=settings.web_read_timeout_seconds,
        any_host_paths=(),
    )
    return ConsoleClient(TestClient(app, base_url=settings.public_base_url), clock)
