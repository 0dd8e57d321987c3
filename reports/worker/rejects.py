"""Messages a consumer rejects or cannot decode, handed to the middleware that stores dead letters
while the broker still holds them: on RabbitMQ and SQS they are stored before they are acked."""

from __future__ import annotations

import logging

import dramatiq

from reports.worker.consumer import HOOK

logger = logging.getLogger(__name__)


def store(broker: dramatiq.Broker, queue_name: str, message_id: str, body: bytes) -> bool:
    """Hand a rejected message to the middleware that stores dead letters; whether one did.

    ``False`` also when storing failed: the caller then moves it into the broker's own
    dead-letter queue, which the workers sweep into the store once it is reachable.
    """
    hooks = [hook for m in broker.middleware if (hook := getattr(m, HOOK, None)) is not None]
    try:
        for hook in hooks:
            hook(broker, queue_name, message_id, body)
    except Exception:
        logger.warning(
            "Could not store rejected message %s of %s; moving it to the broker's dead-letter queue.",
            message_id,
            queue_name,
            exc_info=True,
            extra={"message_id": message_id, "queue": queue_name},
        )
        return False
    return bool(hooks)
