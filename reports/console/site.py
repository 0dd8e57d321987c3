"""The whole console: the application of :mod:`.app` with its pages (:mod:`.views`) and actions (:mod:`.actions`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import BaseRoute

from reports.console import actions, app, views
from reports.settings import Settings

PREFIX = app.PREFIX


def routes(
    settings: Settings,
    sessions: sessionmaker[Session],
    *,
    redis_client: redis.Redis | None = None,
    clock: Callable[[], float] = time.time,
) -> list[BaseRoute]:
    """The console mounted at :data:`PREFIX`; none while CONSOLE_USERS is unset."""
    return app.routes(settings, sessions, parts=(views.routes, actions.routes), redis_client=redis_client, clock=clock)
