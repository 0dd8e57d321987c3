"""Actors for bench/recovery.py, loaded by real ``python -m dramatiq bench.recovery_actors`` workers.

The mode comes from ``BENCH_RECOVERY_MODE``:

- ``project`` (default): the broker is ``reports.worker.broker.build_broker(Settings.from_env())``, so
  the project's ``heartbeat_timeout_ms`` and ``maintenance_chance`` apply, and the project's
  ``Heartbeat`` middleware is added exactly as ``actors/__init__.py`` adds it.
- ``defaults``: a plain ``RedisBroker`` with Dramatiq's default heartbeat timeout (60 s) and
  maintenance chance (1000 per million), default middleware, no ``Heartbeat``.
- ``rabbitmq``: built as in ``project``, on a RabbitMQ ``BROKER_URL`` (amqp://, refused otherwise);
  ``REDIS_URL`` is the bench's Redis. ``Heartbeat`` is added as in ``actors/__init__.py``, where it
  does nothing on RabbitMQ.

In every mode the broker URL and namespace come from ``Settings.from_env()`` (``BROKER_URL``,
``BROKER_NAMESPACE``), so every run can use a fresh namespace (or, on RabbitMQ, a fresh vhost).

Bookkeeping goes to the fleet's shared Redis as the project reaches it
(``reports.worker.broker.shared_redis``): on Redis that is the broker's own client, used for plain
Redis commands, never through the broker's dispatch script, so it neither refreshes heartbeats nor
takes part in the maintenance draw; on RabbitMQ it is ``REDIS_URL``.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from bench.recovery_keys import ACTOR, MODE_VARIABLE, MODES, QUEUE, ready_key, starts_key
from reports.settings import Settings
from reports.worker.broker import Broker, build_broker, shared_redis
from reports.worker.lifecycle import Heartbeat

#: How long ``hold`` keeps its message in flight: far longer than any run of the bench.
HOLD_SECONDS = 3600


class AnnounceReady(Middleware):
    """Tell the bench that this worker process has booted and is polling its queues."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client, self.namespace = client, namespace

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.client.rpush(ready_key(self.namespace), os.getpid())


def _build(mode: str, settings: Settings) -> Broker:
    if mode in ("project", "rabbitmq"):
        if mode == "rabbitmq" and not settings.broker_is_rabbitmq:
            raise SystemExit(f"{MODE_VARIABLE}=rabbitmq needs an amqp:// BROKER_URL.")
        broker = build_broker(settings)
        # As in actors/__init__.py.
        broker.add_middleware(Heartbeat(interval_seconds=settings.heartbeat_timeout_ms / 4000))
    elif mode == "defaults":
        broker = RedisBroker(url=settings.broker_url, namespace=settings.broker_namespace)
    else:
        raise SystemExit(f"{MODE_VARIABLE} must be one of {MODES}, got {mode!r}.")
    return broker


mode = os.environ.get(MODE_VARIABLE, "project")
settings = Settings.from_env()
broker = _build(mode, settings)
#: The bench's Redis: the broker's own client on Redis, REDIS_URL on RabbitMQ.
bookkeeping = shared_redis(broker, settings)
broker.add_middleware(AnnounceReady(bookkeeping, settings.broker_namespace))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, time_limit=(HOLD_SECONDS + 60) * 1000)
def hold(token: str) -> None:
    """Record this start, then stay in flight until the process is killed."""
    bookkeeping.rpush(starts_key(token), json.dumps({"t": time.time(), "pid": os.getpid()}))
    time.sleep(HOLD_SECONDS)
