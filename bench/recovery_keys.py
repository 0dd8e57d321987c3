"""Redis keys shared by bench/recovery.py and the worker-side bench/recovery_actors.py."""

from __future__ import annotations

#: Environment variable that selects the broker wiring in bench/recovery_actors.py.
MODE_VARIABLE = "BENCH_RECOVERY_MODE"
#: "project": reports.worker.broker.build_broker + Heartbeat on Redis; "defaults": a plain RedisBroker;
#: "rabbitmq": the same wiring as "project", with BROKER_URL a RabbitMQ vhost and REDIS_URL the bench's Redis.
MODES = ("project", "defaults", "rabbitmq")
#: The queue the ``hold`` actor lives on.
QUEUE = "default"
ACTOR = "hold"


def starts_key(token: str) -> str:
    """The Redis list every start of ``hold(token)`` is appended to, as JSON {"t", "pid"}."""
    return f"bench:starts:{token}"


def ready_key(namespace: str) -> str:
    """The Redis list a worker process appends its pid to once its consumers are running."""
    return f"bench:ready:{namespace}"
