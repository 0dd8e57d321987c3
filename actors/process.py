"""A worker process's resources: the pipeline's context and the dead-letter sink, built on first use
(after the worker process starts)."""

from __future__ import annotations

import threading

import redis

from reports import counters
from reports.database import create_db_engine, session_factory
from reports.dead_message import DeadMessage
from reports.delivery import send_rate
from reports.delivery.brake import Brake
from reports.delivery.breaker import STATE_CACHE_MS, CircuitBreaker, mail_breaker_name
from reports.delivery.mail.backend import build_mailer
from reports.delivery.pipeline import Context
from reports.delivery.store import open_store
from reports.failures.alerts import WebhookAlerts
from reports.look import ReportLook
from reports.settings import Settings
from reports.worker.dead_letter_sink import DeadLetterSink


class WorkerProcess:
    def __init__(self, settings: Settings, *, redis_client: redis.Redis) -> None:
        self.settings = settings
        self.redis = redis_client
        self._context: Context | None = None
        self._sink: DeadLetterSink | None = None
        self._webhook: WebhookAlerts | None = None
        self._lock = threading.RLock()

    @property
    def context(self) -> Context:
        if self._context is None:
            with self._lock:
                if self._context is None:
                    self._context = self._build_context()
        return self._context

    @property
    def dead_letter_sink(self) -> DeadLetterSink:
        if self._sink is None:
            with self._lock:
                if self._sink is None:
                    self._sink = self._build_sink()
        return self._sink

    def booted(self) -> None:
        """Once the worker process runs: its alerts post what is pending at each window's end,
        also what a process that stopped left counted."""
        alerts = self._alerts()
        if alerts is not None:
            alerts.watch()

    def record_dead(self, dead: DeadMessage) -> None:
        """Store a dead message: the sink, and the engine under it, are built in the worker process."""
        self.dead_letter_sink(dead)

    def _build_context(self) -> Context:
        settings = self.settings
        breaker = None
        if settings.smtp_url:
            breaker = CircuitBreaker(
                self.redis,
                name=mail_breaker_name(settings.broker_namespace),
                failure_threshold=settings.breaker_failure_threshold,
                window_ms=int(settings.breaker_window_seconds * 1000),
                cooldown_ms=int(settings.breaker_cooldown_seconds * 1000),
                # A probe that never reports back (its worker died) frees the slot after this.
                probe_timeout_ms=int(settings.smtp_timeout_seconds * 3000),
                # Sends within this of another process opening it may still go out (reports.delivery.breaker).
                state_cache_ms=STATE_CACHE_MS,
                on_change=lambda _before, after: counters.count(
                    self.redis, settings.broker_namespace, "breaker_transitions", "mail", str(after)
                ),
            )
        sessions = session_factory(create_db_engine(settings.database_url))
        return Context(
            settings=settings,
            sessions=sessions,
            # The one place the process picks its database's statements.
            store=open_store(sessions),
            mailer=build_mailer(settings),
            breaker=breaker,
            send_rate=send_rate.build(
                self.redis,
                namespace=settings.broker_namespace,
                per_second=settings.send_rate_per_second,
                burst=settings.send_rate_burst,
                follow_provider=bool(settings.smtp_url),
            ),
            brake=self._build_brake() if settings.smtp_url else None,
            look=ReportLook.from_settings(settings),
        )

    def _build_brake(self) -> Brake:
        alerts = self._alerts()
        return Brake(
            self.redis,
            namespace=self.settings.broker_namespace,
            threshold=self.settings.brake_failure_threshold,
            window_seconds=self.settings.brake_window_seconds,
            alert=None if alerts is None else alerts.period_paused,
        )

    def _alerts(self) -> WebhookAlerts | None:
        """The dead-letter and brake alerts, one per process (its flusher thread included)."""
        settings = self.settings
        if settings.alert_webhook_url and self._webhook is None:
            self._webhook = WebhookAlerts(
                settings.alert_webhook_url,
                self.redis,
                namespace=settings.broker_namespace,
                window_seconds=settings.alert_window_seconds,
            )
        return self._webhook

    def _build_sink(self) -> DeadLetterSink:
        settings = self.settings
        return DeadLetterSink(
            self.context.sessions,
            alerts=self._alerts(),
            on_stored=lambda dead: counters.count(
                self.redis, settings.broker_namespace, "dead_letters", dead.queue, dead.actor, dead.reason
            ),
        )
