"""The Dramatiq entry point: ``dramatiq actors`` imports this package and nothing else.

The broker and every middleware whose options the actors use must be in place before any
``@dramatiq.actor`` runs: an actor binds to the global broker when it is declared, and without
one Dramatiq silently makes a default broker on localhost whose worker consumes nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

import dramatiq

from actors.process import WorkerProcess
from reports.content.render import missing_catalogs_warning
from reports.errors import ConfigurationError
from reports.settings import Settings
from reports.worker import failure_logs
from reports.worker.actor_metrics import ActorMetrics
from reports.worker.broker import build_broker, declare_queues, shared_redis
from reports.worker.cpu_affinity import PinToCpu
from reports.worker.dead_letter_sink import BrokerDeadLetters
from reports.worker.lifecycle import AfterBoot, DrainOnce, Heartbeat, StopWithMaster
from reports.worker.queues import queue_for
from reports.worker.retries import JitteredRetries

#: A second SIGTERM this soon after the first is the platform's duplicate, not a new request.
REPEATED_SIGTERM_WINDOW_SECONDS = 5.0

#: Exit code for configuration the worker rejected at start (the CLI's code for bad input).
EXIT_BAD_CONFIGURATION = 2


def _refuse(error: ConfigurationError) -> NoReturn:
    # One line instead of an import traceback; the dramatiq master then stops with this code.
    print(f"error: {error}", file=sys.stderr)
    sys.exit(EXIT_BAD_CONFIGURATION)


try:
    _settings = Settings.from_env()
except ConfigurationError as error:
    _refuse(error)
# Dramatiq's command line set logging up at INFO (DEBUG with -v): LOG_LEVEL is what this process logs at.
logging.getLogger().setLevel(_settings.log_level.upper())
# Not a refusal: the reports are still right but for their words, and a replay of an older month needs workers.
if (_no_catalog := missing_catalogs_warning(_settings.templates_dir, _settings.template_version)) is not None:
    logging.getLogger(__name__).warning(_no_catalog)
broker = build_broker(_settings)
queue = queue_for(broker)
_shared_redis = shared_redis(broker, _settings)
worker = WorkerProcess(_settings, redis_client=_shared_redis)
broker.add_middleware(
    JitteredRetries(
        max_retries=_settings.max_retries,
        min_backoff_ms=_settings.min_backoff_ms,
        max_backoff_ms=_settings.max_backoff_ms,
        on_dead=worker.record_dead,
    )
)
# Before the retries: after-hooks run in reverse, so it records the retry middleware's verdict.
broker.add_middleware(ActorMetrics(_shared_redis, namespace=_settings.broker_namespace), before=JitteredRetries)
broker.add_middleware(BrokerDeadLetters(worker.record_dead, interval_seconds=_settings.dead_letter_sweep_seconds))
broker.add_middleware(Heartbeat(interval_seconds=_settings.heartbeat_timeout_ms / 4000))
broker.add_middleware(DrainOnce(window_seconds=REPEATED_SIGTERM_WINDOW_SECONDS))
broker.add_middleware(StopWithMaster())
broker.add_middleware(AfterBoot(worker.booted))
if _settings.worker_cpu_affinity == "auto":
    broker.add_middleware(PinToCpu())
dramatiq.set_broker(broker)
# Expected failures are logged once each, by the retries and the dead-letter sink, not by Dramatiq.
failure_logs.install()

from actors import coordinator, report  # noqa: E402, F401  (declared against the broker set above)

try:
    declare_queues(broker, sorted(broker.get_declared_queues()))
except ConfigurationError as error:
    _refuse(error)
