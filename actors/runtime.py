"""Per-process resources for the actors, built on first use (after the worker process starts)."""

from __future__ import annotations

import threading

from reports.database import create_db_engine, session_factory
from reports.mail.backend import build_mailer
from reports.pipeline import Context
from reports.settings import Settings


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._context: Context | None = None
        self._lock = threading.Lock()

    @property
    def context(self) -> Context:
        if self._context is None:
            with self._lock:
                if self._context is None:
                    engine = create_db_engine(self.settings.database_url)
                    self._context = Context(
                        settings=self.settings, sessions=session_factory(engine), mailer=build_mailer(self.settings)
                    )
        return self._context
